"""The batcher's streamer sends the answer cut's reading of a row: the pieces add up to the final answer,
also for the reply shapes graph tokens produce (a lead-in line, an echoed memory entry)."""

from __future__ import annotations

import pytest
import torch

from qgmem.prompting import final_answer
from qgmem.serving.batcher import RowStreamer


@pytest.mark.parametrize("reply", [
    "Pottery.\nMore text",
    "The answer is:\nBecoming by Michelle Obama.\n",
    "The answer is: pottery (twice a week).\n",
    "[M5] Books have such an awesome power. (Caroline; turn 98; said 20",
    "Answer:\n\n[M2] She moved to Lisbon (Mel; turns 4-5; happened 2022)\nmore",
    "The user moved (in May) to Lisbon.",
])
def test_streamed_pieces_add_up_to_the_final_answer(smollm2_tokenizer, reply):
    tok = smollm2_tokenizer
    pieces: list[str] = []
    streamer = RowStreamer(tok, [pieces.append], stop_ids=set())
    for token in tok(reply, add_special_tokens=False)["input_ids"]:
        streamer.put(torch.tensor([token]))
    assert "".join(pieces) == final_answer(reply) != ""
    assert not any(p.startswith(("The answer", "Answer", "[M")) for p in pieces)


def test_the_row_ends_after_its_answer_line_not_after_a_lead_in(smollm2_tokenizer):
    tok = smollm2_tokenizer
    streamer = RowStreamer(tok, [lambda piece: None], stop_ids=set())
    for token in tok("The answer is:\n", add_special_tokens=False)["input_ids"]:
        streamer.put(torch.tensor([token]))
    assert not streamer.done[0]
    for token in tok("Pottery.\n", add_special_tokens=False)["input_ids"]:
        streamer.put(torch.tensor([token]))
    assert streamer.done[0] and streamer.sent[0] == "Pottery."
