"""The engine double speaks the prompt-embeddings wire format and decodes as the in-process path does."""

from __future__ import annotations

import httpx
import pytest
import torch

from qgmem.lm import load_causal_lm, load_tokenizer
from qgmem.llm.base import LLMConfig
from qgmem.llm.prompt_embeds import EngineError, PromptEmbedsClient, encode_embeds
from qgmem.prompting import PromptEncoder, PromptSettings, generate

from .engine_double import EngineDouble, RunningEngine


@pytest.fixture(scope="module")
def double(tiny_lm_path):
    lm = load_causal_lm(tiny_lm_path, dtype="float32")
    engine = EngineDouble(lm, load_tokenizer(tiny_lm_path), "tiny")
    with RunningEngine(engine) as url:
        yield engine, url


@pytest.fixture(scope="module")
def prompts(double):
    engine, _ = double
    encoder = PromptEncoder(engine.tokenizer, PromptSettings(max_prompt_tokens=256))
    questions = ["Where do I live?", "What did I buy?", "Who visited me last weekend in Lisbon?"]
    encoded = [encoder.prompt("[M1] I live in Lisbon.", q) for q in questions]
    table = engine.lm.get_input_embeddings()
    return encoder, [table(torch.tensor(p.ids)) for p in encoded]


def _client(url: str, **overrides) -> PromptEmbedsClient:
    settings = {"model": "tiny", "backoff_s": 0.0, "max_retries": 1, "timeout_s": 30.0, **overrides}
    return PromptEmbedsClient(LLMConfig(backend="openai", base_url=url, **settings))


def test_answers_equal_the_in_process_greedy_decoding(double, prompts):
    engine, url = double
    encoder, embeds = prompts
    out = _client(url).complete(embeds, max_tokens=[6, 6, 3], stop_ids=encoder.stop_ids, stop_at_newline=True)
    for e, cap, got in zip(embeds, [6, 6, 3], out):
        local = generate(engine.lm, engine.tokenizer, torch.ones(1, e.size(0), dtype=torch.long),
                         inputs_embeds=e.unsqueeze(0), max_new_tokens=cap, stop_ids=encoder.stop_ids,
                         pad_id=encoder.pad_id, stop_at_newline=True)
        assert got.text == local.texts[0].split("\n", 1)[0]
        assert got.completion_tokens == len(local.ids[0]) and got.prompt_tokens == e.size(0)
        ended = local.ids[0][-1] in encoder.stop_ids or "\n" in local.texts[0]
        assert got.finish_reason == ("stop" if ended else "length")


def test_streamed_pieces_add_up_to_the_non_streamed_answer(double, prompts):
    _, url = double
    encoder, embeds = prompts
    client = _client(url)
    plain = client.complete(embeds, max_tokens=[6] * 3, stop_ids=encoder.stop_ids, stop_at_newline=True)
    pieces = [[], [], []]
    streamed = client.complete(embeds, max_tokens=[6] * 3, stop_ids=encoder.stop_ids, stop_at_newline=True,
                               on_text=[p.append for p in pieces])
    assert [c.text for c in streamed] == [c.text for c in plain] == ["".join(p) for p in pieces]
    assert [(c.finish_reason, c.completion_tokens) for c in streamed] == \
        [(c.finish_reason, c.completion_tokens) for c in plain]


def test_a_request_the_double_refuses_is_a_502_with_its_message(double, prompts):
    _, url = double
    encoder, embeds = prompts
    with pytest.raises(EngineError, match="The model `other` does not exist") as caught:
        _client(url, model="other").complete(embeds[:1], max_tokens=[2], stop_ids=encoder.stop_ids,
                                              stop_at_newline=True)
    assert caught.value.status == 502


@pytest.mark.parametrize("body,message", [
    ({"model": "tiny", "temperature": 0.0}, "At least one of `prompt` or `prompt_embeds`"),
    ({"model": "tiny", "temperature": 0.0, "prompt_embeds": "xx"}, "not base64"),
    ({"model": "tiny", "temperature": 0.7, "prompt_embeds": encode_embeds(torch.zeros(2, 32))}, "greedily"),
    ({"model": "tiny", "temperature": 0.0, "prompt_embeds": encode_embeds(torch.zeros(2, 8))}, "hidden size 8"),
])
def test_the_double_checks_requests(double, body, message):
    _, url = double
    reply = httpx.post(f"{url}/completions", json=body, timeout=10)
    assert reply.status_code == 400 and message in reply.json()["message"]
