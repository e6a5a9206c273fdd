"""The service's defects of the third probe, each shown over HTTP: bad input that became a 500, and the
answer's token cap (``max_tokens`` / ``max_completion_tokens``, ``finish_reason``)."""

from __future__ import annotations

import json

import httpx
import pytest

pytest.importorskip("fastapi")

from qgmem.serving.server import create_app

from .server_helpers import running
from .test_server import ALICE, _service, pipeline  # noqa: F401  (fixture)

QUESTION = {"user": "alice", "messages": [{"role": "user", "content": "Where do I live?"}]}


@pytest.fixture(scope="module")
def alice(pipeline, tmp_path_factory):  # noqa: F811
    """One server (the tiny LM, answers capped at 4 tokens) with alice's session, for the whole module.
    The random LM's first token ends its answer (a stop token or a line break), so here its answers run
    on (the only stop id one it never picks, the whole text read): the cap is what ends them."""
    import copy
    import dataclasses

    service = _service(pipeline, tmp_path_factory.mktemp("input"))
    pipe = service.pipeline
    pipe.prompts = copy.copy(pipe.prompts)
    pipe.prompts.stop_ids = [0]
    pipe.contract = dataclasses.replace(pipe.contract, prompt=dataclasses.replace(pipe.prompt_settings, first_line=False))
    with running(create_app(service)) as url:
        httpx.post(f"{url}/v1/users/alice/sessions", json={"turns": ALICE}).raise_for_status()
        yield url


SURROGATE = '"\\udcff"'  # a lone surrogate, as a JSON escape
DEEP = b"[" * 100_000 + b"]" * 100_000


@pytest.mark.parametrize("path,body,field", [
    ("/v1/users/alice/sessions", '{"turns": [{"speaker": "User", "text": %s}]}' % SURROGATE, "turns[0].text"),
    ("/v1/users/alice/sessions", '{"turns": [{"speaker": %s, "text": "hi"}]}' % SURROGATE, "turns[0].speaker"),
    ("/v1/users/alice/answer", '{"question": %s}' % SURROGATE, "question"),
    ("/v1/chat/completions", '{"user": "alice", "messages": [{"role": "user", "content": %s}]}' % SURROGATE,
     "messages[0].content"),
    ("/v1/chat/completions", '{"user": "alice", "model": %s, "messages": [{"role": "user", "content": "hi"}]}'
     % SURROGATE, "model"),
])
def test_a_lone_surrogate_is_a_400_naming_the_field(alice, path, body, field):
    """Was: 500 (UnicodeEncodeError in session_digest, TypeError in the tokenizer)."""
    r = httpx.post(alice + path, content=body.encode(), headers={"content-type": "application/json"}, timeout=60)
    assert r.status_code == 400, r.text
    message = r.json()["error"]["message"]
    assert f"field '{field}'" in message and "lone surrogate" in message
    fine = body.replace(SURROGATE, '"Where do I live?"')  # control: the same body with text is served
    assert httpx.post(alice + path, content=fine.encode(), headers={"content-type": "application/json"},
                      timeout=60).status_code == 200


@pytest.mark.parametrize("path", ["/v1/users/alice/sessions", "/v1/users/alice/answer", "/v1/chat/completions"])
def test_json_nested_100000_deep_is_a_400(alice, path):
    """Was: 500 (RecursionError in json.loads)."""
    r = httpx.post(alice + path, content=DEEP, headers={"content-type": "application/json"}, timeout=60)
    assert r.status_code == 400 and "nested" in r.json()["error"]["message"], r.text
    shallow = httpx.post(alice + path, content=b"[[1]]", headers={"content-type": "application/json"})
    assert shallow.status_code == 400 and "nested" not in shallow.json()["error"]["message"]


def _stream(url: str, body: dict) -> tuple[str, dict]:
    with httpx.stream("POST", f"{url}/v1/chat/completions", json={**body, "stream": True}, timeout=60) as r:
        assert r.status_code == 200
        chunks = [json.loads(line[6:]) for line in r.iter_lines() if line and line != "data: [DONE]"]
    return "".join(c["choices"][0]["delta"].get("content", "") for c in chunks), chunks[-1]


@pytest.mark.parametrize("field", ["max_tokens", "max_completion_tokens"])
def test_max_tokens_is_honoured_capped_by_the_server_and_length_is_reported(alice, field):
    """Was: ``max_tokens=1`` ignored and ``finish_reason`` always "stop". The tiny LM never ends its own
    answer within the server's cap of 4 tokens, so the uncapped answer is cut there too: "length"."""
    full = httpx.post(f"{alice}/v1/chat/completions", json=QUESTION, timeout=60).json()
    assert full["usage"]["completion_tokens"] == 4 and full["choices"][0]["finish_reason"] == "length"
    one = httpx.post(f"{alice}/v1/chat/completions", json={**QUESTION, field: 1}, timeout=60).json()
    assert one["usage"]["completion_tokens"] == 1 and one["choices"][0]["finish_reason"] == "length"
    assert full["choices"][0]["message"]["content"].startswith(one["choices"][0]["message"]["content"])
    over = httpx.post(f"{alice}/v1/chat/completions", json={**QUESTION, field: 1000}, timeout=60).json()
    assert over["usage"]["completion_tokens"] == 4  # capped by the server's limit, same answer
    assert over["choices"][0]["message"]["content"] == full["choices"][0]["message"]["content"]
    text, last = _stream(alice, {**QUESTION, field: 1})
    assert text == one["choices"][0]["message"]["content"] and last["choices"][0]["finish_reason"] == "length"
    assert last["usage"]["completion_tokens"] == 1
    two = httpx.post(f"{alice}/v1/users/alice/answer", json={"question": "Where do I live?", "max_tokens": 2},
                     timeout=60).json()
    assert two["tokens"]["generated"] == 2 and two["finish_reason"] == "length"


def test_an_answer_that_ends_itself_reports_stop(pipeline, tmp_path, monkeypatch):  # noqa: F811
    """The negative control of "length": a row that meets a stop token within its cap is "stop"."""
    from qgmem.prompting import Generation

    service = _service(pipeline, tmp_path)
    stop = service.pipeline.prompts.stop_ids[0]
    out, finish = service.pipeline._cut(Generation([[5, 6, stop], [5, 6, 7, 8]], ["ab", "abcd"]), [4, 4], False)
    assert finish == ["stop", "length"] and out.ids[1] == [5, 6, 7, 8]
    out, finish = service.pipeline._cut(Generation([[5, 6, 7]], ["a\nb"]), [2], True)
    assert finish == ["length"] and out.ids == [[5, 6]]
    out, finish = service.pipeline._cut(Generation([[5, 6, 7]], ["a\nb"]), [3], True)
    assert finish == ["stop"]
