"""The prompt-embeddings client: vLLM's wire format, replies, streaming, and failures through the shared backend."""

from __future__ import annotations

import base64
import io
import json
import time

import pytest
import torch

from qgmem.llm.base import LLMConfig
from qgmem.llm.http import OpenAIChatBackend
from qgmem.llm.prompt_embeds import (EngineError, PromptEmbedsClient, completion_body, decode_embeds, encode_embeds,
                                     parse_completion)

from .helpers import StubServer

EMBEDS = torch.arange(12, dtype=torch.float32).reshape(3, 4) / 7


def _client(url: str, **overrides) -> PromptEmbedsClient:
    settings = {"backoff_s": 0.0, "max_retries": 2, "timeout_s": 2.0, **overrides}
    config = LLMConfig(backend="openai", model="engine-model", base_url=url, **settings)
    return PromptEmbedsClient(config, OpenAIChatBackend(config, sleep=lambda s: None))


def _reply(text: str, finish: str = "stop", prompt: int = 3, completion: int = 2) -> tuple[int, str]:
    return 200, json.dumps({"id": "cmpl-1", "object": "text_completion", "model": "engine-model",
                            "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": finish}],
                            "usage": {"prompt_tokens": prompt, "completion_tokens": completion}})


def _events(pieces: list[str], finish: str = "stop", usage: tuple[int, int] = (3, 2), done: bool = True) -> str:
    lines = [json.dumps({"choices": [{"index": 0, "text": p, "finish_reason": None}]}) for p in pieces]
    lines.append(json.dumps({"choices": [{"index": 0, "text": "", "finish_reason": finish}]}))
    lines.append(json.dumps({"choices": [], "usage": {"prompt_tokens": usage[0], "completion_tokens": usage[1]}}))
    if done:
        lines.append("[DONE]")
    return "".join(f"data: {line}\n\n" for line in lines)


def _complete(client, prompts=(EMBEDS,), caps=(5,), on_text=None):
    return client.complete(list(prompts), max_tokens=list(caps), stop_ids=[2, 0], stop_at_newline=True,
                           on_text=on_text)


# --- the wire format ---------------------------------------------------------------------------------------

def test_prompt_embeds_is_base64_of_torch_save_of_the_2d_tensor():
    text = encode_embeds(EMBEDS)
    loaded = torch.load(io.BytesIO(base64.b64decode(text)), weights_only=True)  # how vLLM reads it
    assert loaded.shape == (3, 4) and loaded.dtype == torch.float32 and torch.equal(loaded, EMBEDS)
    assert torch.equal(decode_embeds(text), EMBEDS)


def test_a_row_of_a_batch_is_sent_without_the_rest_of_the_batch():
    batch = torch.zeros(64, 100, 4)
    assert len(encode_embeds(batch[1])) == len(encode_embeds(torch.zeros(100, 4)))


@pytest.mark.parametrize("value,message", [
    (torch.zeros(2, 3, 4), "must be (sequence_length, hidden_size)"),
    (torch.zeros(4), "must be (sequence_length, hidden_size)"),
    (torch.zeros(0, 4), "must be (sequence_length, hidden_size)"),
    (torch.zeros(2, 4, dtype=torch.long), "float32, bfloat16 or float16"),
    ({"x": torch.zeros(2, 4)}, "float32, bfloat16 or float16"),
])
def test_decode_checks_shape_and_dtype_as_an_engine_does(value, message):
    buffer = io.BytesIO()
    torch.save(value, buffer)
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        decode_embeds(base64.b64encode(buffer.getvalue()).decode())


def test_decode_takes_a_leading_batch_of_one_and_rejects_junk():
    buffer = io.BytesIO()
    torch.save(EMBEDS.unsqueeze(0), buffer)
    assert decode_embeds(base64.b64encode(buffer.getvalue()).decode()).shape == (3, 4)
    with pytest.raises(ValueError, match="not base64 of a torch.save'd tensor"):
        decode_embeds("not base64!")


def test_the_request_body_follows_vllm_completions():
    body = completion_body("m", EMBEDS, max_tokens=7, stop_ids=[2, 0], stop_at_newline=True, stream=False)
    assert set(body) == {"model", "prompt_embeds", "max_tokens", "temperature", "stop_token_ids", "stop"}
    assert (body["model"], body["max_tokens"], body["temperature"], body["stop"], body["stop_token_ids"]) == \
        ("m", 7, 0.0, ["\n"], [2, 0])
    streamed = completion_body("m", EMBEDS, max_tokens=7, stop_ids=[2], stop_at_newline=False, stream=True)
    assert "stop" not in streamed and streamed["stream"] is True
    assert streamed["stream_options"] == {"include_usage": True}


def test_parse_reads_text_finish_reason_and_usage():
    result = parse_completion(_reply("Lisbon", "length", 40, 5)[1].encode())
    assert (result.text, result.finish_reason, result.prompt_tokens, result.completion_tokens, result.error) == \
        ("Lisbon", "length", 40, 5, None)
    assert "unreadable completion" in parse_completion(b'{"choices": []}').error


# --- the client against a scripted server ------------------------------------------------------------------

def test_non_streamed_answers_come_back_in_order_with_finish_reason_and_usage():
    with StubServer(lambda req: _reply(f"answer {req['max_tokens']}", "length" if req["max_tokens"] == 2 else "stop",
                                       7, req["max_tokens"])) as server:
        out = _complete(_client(server.url), prompts=(EMBEDS, EMBEDS[:2]), caps=(2, 6))
    assert [(c.text, c.finish_reason, c.prompt_tokens, c.completion_tokens) for c in out] == \
        [("answer 2", "length", 7, 2), ("answer 6", "stop", 7, 6)]
    sent = sorted(server.requests, key=lambda r: r["max_tokens"])
    assert [decode_embeds(r["prompt_embeds"]).shape for r in sent] == [(3, 4), (2, 4)]
    assert all(r["model"] == "engine-model" and r["stop"] == ["\n"] and "prompt" not in r for r in sent)


def test_an_empty_answer_is_an_answer_not_a_failure():
    with StubServer(lambda req: _reply("", "stop", 3, 1)) as server:
        [out] = _complete(_client(server.url))
    assert (out.text, out.finish_reason) == ("", "stop") and len(server.requests) == 1


def test_streamed_pieces_reach_the_callback_and_add_up_to_the_answer():
    pieces = []
    with StubServer(lambda req: (200, _events(["Lis", "bon", " city"], "stop", (9, 4)))) as server:
        [out] = _complete(_client(server.url), on_text=[pieces.append])
    assert pieces == ["Lis", "bon", " city"] and out.text == "Lisbon city"
    assert (out.finish_reason, out.prompt_tokens, out.completion_tokens) == ("stop", 9, 4)
    assert server.requests[0]["stream"] is True


def test_a_stream_cut_before_its_end_is_a_failure_and_not_sent_again():
    cut = 'data: {"choices": [{"index": 0, "text": "Lis", "finish_reason": null}]}\n\n'
    pieces = []
    with StubServer(lambda req: (200, cut)) as server:
        with pytest.raises(EngineError, match="stream ended before its last event") as caught:
            _complete(_client(server.url), on_text=[pieces.append])
    assert caught.value.status == 502 and pieces == ["Lis"]


def test_an_error_event_in_the_stream_is_reported():
    body = 'data: {"error": {"message": "engine overloaded", "code": 500}}\n\ndata: [DONE]\n\n'
    with StubServer(lambda req: (200, body)) as server:
        with pytest.raises(EngineError, match="the engine reported: engine overloaded"):
            _complete(_client(server.url), on_text=[lambda piece: None])


def test_5xx_is_retried_through_the_shared_backend_then_answers():
    script = iter([(503, "warming up"), (500, "oops"), _reply("ok")])
    with StubServer(lambda req: next(script)) as server:
        client = _client(server.url)
        [out] = _complete(client)
    assert out.text == "ok" and len(server.requests) == 3 and client.usage.retries == 2


def test_a_refused_request_is_a_502_naming_the_engine_and_its_message_without_retry():
    with StubServer(lambda req: (404, '{"message": "The model `engine-model` does not exist."}')) as server:
        with pytest.raises(EngineError) as caught:
            _complete(_client(server.url))
    assert caught.value.status == 502 and len(server.requests) == 1
    assert f"the LM engine at {server.url} did not answer: HTTP 404" in str(caught.value)
    assert "does not exist" in str(caught.value)


def test_an_unreachable_engine_is_a_502():
    with pytest.raises(EngineError, match="connection error") as caught:
        _complete(_client("http://127.0.0.1:9/v1", max_retries=1))
    assert caught.value.status == 502


def test_a_silent_engine_is_a_504_within_the_deadline():
    with StubServer(lambda req: ("sleep", 3.0)) as server:
        started = time.monotonic()
        with pytest.raises(EngineError, match="timeout after 0.3s") as caught:
            _complete(_client(server.url, timeout_s=0.3, deadline_s=5.0, max_retries=1))
        elapsed = time.monotonic() - started
    assert caught.value.status == 504 and elapsed < 2.0


def test_the_deadline_bounds_retries_of_a_failing_engine():
    with StubServer(lambda req: (503, "busy")) as server:
        client = PromptEmbedsClient(LLMConfig(backend="openai", model="m", base_url=server.url, max_retries=50,
                                              backoff_s=0.2, deadline_s=0.8, timeout_s=0.5))
        started = time.monotonic()
        with pytest.raises(EngineError, match="deadline of 0.8s exceeded") as caught:
            _complete(client)
    assert caught.value.status == 504 and time.monotonic() - started < 1.5


def test_the_api_key_goes_in_the_header_and_never_in_an_error(monkeypatch):
    monkeypatch.setenv("ENGINE_KEY", "sk-engine-secret")
    with StubServer(lambda req: (401, "bad key sk-engine-secret")) as server:
        with pytest.raises(EngineError) as caught:
            _complete(_client(server.url, api_key_env="ENGINE_KEY"))
    assert server.headers[0]["Authorization"] == "Bearer sk-engine-secret"
    assert "sk-engine-secret" not in str(caught.value) and "[redacted]" in str(caught.value)
