"""The one generation helper: batched, left-padded decoding from token ids or from fused embeddings.

The answer filter, the local LLM backend, training's EM/F1 and serving all decode through
:func:`generate`, so an answer reads the same wherever it was produced: generation stops at the first
stop token (end of turn or eos) and, for answers, at the first line break after a line that holds an
answer (a lead-in such as "The answer is:" does not end it; see
:attr:`~qgmem.prompting.contract.PromptSettings.first_line`); :func:`~qgmem.prompting.answer.final_answer`
turns the decoded text into the answer that is scored.
"""

from __future__ import annotations

import copy
import weakref
from dataclasses import dataclass
from typing import Sequence

import torch

from qgmem.prompting.answer import final_answer, holds_answer_line


@dataclass
class Generation:
    """New token ids per row, cut after the first stop token (or after the line break that ended the
    row, without the batch's padding), and their decoded text."""

    ids: list[list[int]]
    texts: list[str]

    @property
    def num_tokens(self) -> list[int]:
        return [len(row) for row in self.ids]


def left_pad(rows: Sequence[Sequence[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(input_ids, attention_mask)`` ``[B, max_len]`` with every row ending in the last column."""
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for b, row in enumerate(rows):
        if row:
            ids[b, width - len(row):] = torch.tensor(list(row), dtype=torch.long)
            mask[b, width - len(row):] = 1
    return ids, mask


@torch.no_grad()
def generate(lm, tokenizer, attention_mask: torch.Tensor, *, input_ids: torch.Tensor | None = None,
             inputs_embeds: torch.Tensor | None = None, max_new_tokens: int, stop_ids: Sequence[int],
             pad_id: int, stop_at_newline: bool = False, temperature: float = 0.0, streamer=None,
             prefix_ids: Sequence[int] = ()) -> Generation:
    """Continue left-padded prompts (``input_ids`` or ``inputs_embeds``, ``[B, T(, H)]``).

    Greedy at ``temperature`` 0 (sampling above it). ``stop_at_newline`` also ends a row at the first line
    break after a line that holds an answer (:func:`answer_stop`). Special tokens are dropped from the text; thinking blocks are kept (see
    :func:`final_answer`). ``streamer``: a ``transformers`` streamer that gets each step's tokens.
    ``prefix_ids``: the tokens every prompt starts with (the system prompt and template head); when no
    row is padded, their KV cache is computed once per LM (:func:`prefix_cache`) and a copy of it
    continued, so the prefill covers only the rest.
    """
    if (input_ids is None) == (inputs_embeds is None):
        raise ValueError("pass exactly one of input_ids and inputs_embeds")
    device = next(lm.parameters()).device
    kwargs = {"input_ids": input_ids.to(device)} if input_ids is not None else {"inputs_embeds": inputs_embeds}
    if prefix_ids and bool(attention_mask.all()) and attention_mask.size(1) > len(prefix_ids):
        kwargs["cache"] = prefix_cache(lm, prefix_ids, attention_mask.size(0))
    sampling = {"do_sample": True, "temperature": float(temperature)} if temperature > 0 else {"do_sample": False}
    if stop_at_newline:
        start = input_ids.shape[1] if input_ids is not None else 0
        sampling.update(stopping_criteria=[answer_stop(tokenizer, start)])
    out = lm.generate(**kwargs, attention_mask=attention_mask.to(device), max_new_tokens=int(max_new_tokens),
                      eos_token_id=list(stop_ids), pad_token_id=pad_id, num_beams=1, streamer=streamer,
                      **sampling)
    if input_ids is not None:  # generate returns prompt + continuation for ids, the continuation for embeds
        out = out[:, input_ids.shape[1]:]
    stops = set(stop_ids)
    rows = []
    for row in out.tolist():
        end = next((i + 1 for i, tok in enumerate(row) if tok in stops), len(row))
        row = row[:end]
        if stop_at_newline and end > 1 and row[-1] == pad_id and "\n" in tokenizer.decode(row[-2:-1]):
            row = row[:-1]  # a line break ended the row a step earlier: the stop token after it is padding
        rows.append(row)
    texts = tokenizer.batch_decode(rows, skip_special_tokens=True) if rows else []
    return Generation(rows, texts)


#: per LM, the KV cache of each prompt prefix it was asked for (a frozen LM's prefix never changes)
_PREFIXES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


@torch.no_grad()
def prefix_cache(lm, prefix_ids: Sequence[int], batch_size: int = 1):
    """A fresh copy of the KV cache of ``prefix_ids`` for ``batch_size`` rows, the prefix's forward run
    once per LM (from its input embeddings, as fused prompts enter the LM)."""
    key = tuple(int(t) for t in prefix_ids)
    per_lm = _PREFIXES.setdefault(lm, {})
    cache = per_lm.get(key)
    if cache is None:
        ids = torch.tensor([key], dtype=torch.long, device=next(lm.parameters()).device)
        cache = per_lm[key] = lm(inputs_embeds=lm.get_input_embeddings()(ids), use_cache=True).cache
    cache = copy.deepcopy(cache)
    if batch_size > 1:
        cache.batch_repeat_interleave(batch_size)
    return cache


#: per tokenizer, the ids of the tokens whose text holds a line break: finding them reads the whole
#: vocabulary (a fraction of a second for SmolLM2's on a 2-core CPU), which must not recur per call
_NEWLINE_IDS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def newline_ids(tokenizer) -> frozenset[int]:
    """The ids of ``tokenizer``'s tokens that decode to text holding a line break, found once per tokenizer."""
    ids = _NEWLINE_IDS.get(tokenizer)
    if ids is None:
        texts = tokenizer.batch_decode([[i] for i in range(len(tokenizer))])
        ids = _NEWLINE_IDS[tokenizer] = frozenset(i for i, text in enumerate(texts) if "\n" in text)
    return ids


class AnswerStop:
    """The ``transformers`` stopping criterion of an answer: a row ends at a line break once its text
    holds a line that is an answer (:func:`~qgmem.prompting.answer.holds_answer_line`), so a lead-in line
    ("The answer is:") lets it go on to the answer. Only rows whose last token holds a line break are
    decoded; ``start`` is where the generated tokens begin in the ids ``generate`` passes."""

    def __init__(self, tokenizer, newlines: frozenset[int], start: int):
        self.tokenizer, self.newlines, self.start = tokenizer, newlines, start

    def __call__(self, input_ids: torch.Tensor, scores, **kwargs) -> torch.Tensor:
        done = torch.zeros(input_ids.size(0), dtype=torch.bool, device=input_ids.device)
        for row, token in enumerate(input_ids[:, -1].tolist()):
            if token in self.newlines:
                text = self.tokenizer.decode(input_ids[row, self.start:].tolist(), skip_special_tokens=True)
                done[row] = holds_answer_line(text)
        return done


def answer_stop(tokenizer, start: int = 0) -> AnswerStop:
    """The answer's line-break criterion for one ``generate`` call (the vocabulary is read once per tokenizer)."""
    return AnswerStop(tokenizer, newline_ids(tokenizer), start)
