from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from qgmem.llm.backends import LLMConfig, OpenAIChatBackend, make_backend

from .helpers import StubServer, completion

MSG = [[{"role": "user", "content": "hello"}]]


def _backend(url: str, **overrides) -> OpenAIChatBackend:
    settings = {"backoff_s": 0.0, "max_retries": 3, "timeout_s": 2.0, **overrides}
    config = LLMConfig(backend="openai", model="stub-model", base_url=url, **settings)
    return OpenAIChatBackend(config, sleep=lambda s: None)


def peak_counting_responder():
    """A stub handler that answers each prompt upper-cased after 50 ms, and the peak of requests in flight."""
    active, peak, lock = [0], [0], threading.Lock()

    def respond(req):
        with lock:
            active[0] += 1
            peak[0] = max(peak[0], active[0])
        time.sleep(0.05)
        with lock:
            active[0] -= 1
        return completion(req["messages"][0]["content"].upper())

    return respond, peak


def test_success_returns_text_and_usage_and_sends_params():
    with StubServer(lambda req: completion("hi there", 7, 2)) as server:
        backend = _backend(server.url)
        [result] = backend.chat(MSG, max_new_tokens=33, temperature=0.0)
    assert (result.text, result.prompt_tokens, result.completion_tokens, result.error) == ("hi there", 7, 2, None)
    assert server.requests[0] == {"model": "stub-model", "messages": MSG[0], "max_tokens": 33, "temperature": 0.0}
    assert backend.usage.calls == 1 and backend.usage.prompt_tokens == 7


@pytest.mark.parametrize("failures", [[429], [500], [503, 429], [502, 500, 504]])
def test_retries_429_and_5xx_then_succeeds(failures):
    script = iter([(code, "busy") for code in failures] + [completion("ok")])
    with StubServer(lambda req: next(script)) as server:
        backend = _backend(server.url)
        [result] = backend.chat(MSG)
    assert result.text == "ok" and result.error is None
    assert len(server.requests) == len(failures) + 1 and backend.usage.retries == len(failures)


def test_gives_up_after_max_retries_with_an_error_not_an_exception():
    with StubServer(lambda req: (500, "down")) as server:
        [result] = _backend(server.url).chat(MSG)
    assert result.error.startswith("gave up after 4 attempts: HTTP 500") and len(server.requests) == 4


@pytest.mark.parametrize("status,body,expect", [
    (400, '{"error": "bad"}', "HTTP 400"),
    (401, '{"error": "invalid api key"}', "HTTP 401"),
    (200, "this is not json", "unreadable response body"),
    (200, '{"choices": []}', "unreadable response body"),
    (200, '{"choices": [{"message": {"content": null}}]}', "unreadable response body"),
])
def test_client_errors_and_junk_fail_the_item_without_retry(status, body, expect):
    with StubServer(lambda req: (status, body)) as server:
        [result] = _backend(server.url).chat(MSG)
    assert expect in result.error and len(server.requests) == 1


def test_timeout_is_retried_then_reported():
    with StubServer(lambda req: ("sleep", 1.0)) as server:
        backend = _backend(server.url, timeout_s=0.2, max_retries=1)
        [result] = backend.chat(MSG)
    assert "timeout" in result.error and len(server.requests) == 2


def test_unreachable_server_is_an_error_per_item():
    backend = _backend("http://127.0.0.1:9/v1", max_retries=0)
    results = backend.chat(MSG * 2)
    assert [r.error.startswith("gave up") for r in results] == [True, True] and backend.usage.errors == 2


def test_batch_keeps_order_and_bounds_concurrency():
    respond, peak = peak_counting_responder()

    prompts = [[{"role": "user", "content": f"q{i}"}] for i in range(9)]
    with StubServer(respond) as server:
        results = _backend(server.url, max_concurrency=3).chat(prompts)
    assert [r.text for r in results] == [f"Q{i}" for i in range(9)]
    assert 1 <= peak[0] <= 3


def test_one_bad_request_costs_only_its_item():
    def respond(req):
        return (400, "no") if req["messages"][0]["content"] == "bad" else completion("fine")

    prompts = [[{"role": "user", "content": c}] for c in ("a", "bad", "c")]
    with StubServer(respond) as server:
        results = _backend(server.url).chat(prompts)
    assert [r.error is None for r in results] == [True, False, True]


def test_api_key_comes_from_the_named_env_var_and_is_never_exposed(monkeypatch, tmp_path):
    monkeypatch.setenv("QGMEM_TEST_KEY", "sk-secret-123")
    with StubServer(lambda req: (500, "down")) as server:
        backend = make_backend(LLMConfig(backend="openai", model="m", base_url=server.url,
                                         api_key_env="QGMEM_TEST_KEY", max_retries=0,
                                         cache_path=str(tmp_path / "c.sqlite")))
        [result] = backend.chat(MSG)
    assert server.headers[0]["Authorization"] == "Bearer sk-secret-123"
    exposed = repr(backend) + repr(backend.inner.config) + str(backend.inner.config.to_dict()) + result.error
    assert "sk-secret" not in exposed
    assert b"sk-secret" not in (tmp_path / "c.sqlite").read_bytes()


def test_unknown_backend_kind_is_rejected():
    with pytest.raises(ValueError, match="unknown LLM backend"):
        make_backend(LLMConfig(backend="carrier-pigeon"))


def test_callers_on_several_threads_share_one_bound():
    """Threads sharing the backend (cases replayed side by side) never exceed max_concurrency together."""
    respond, peak = peak_counting_responder()

    with StubServer(respond) as server:
        backend = _backend(server.url, max_concurrency=3)
        batches = [[[{"role": "user", "content": f"c{c}q{i}"}] for i in range(4)] for c in range(4)]
        with ThreadPoolExecutor(4) as callers:
            results = list(callers.map(backend.chat, batches))
        backend.close()
    assert [[r.text for r in rs] for rs in results] == [[f"C{c}Q{i}" for i in range(4)] for c in range(4)]
    assert 2 <= peak[0] <= 3  # 4 callers × 4 requests: up to 12 at once if each call had its own bound
    assert len(server.requests) == 16


@pytest.mark.parametrize("status,unavailable", [(503, True), (400, False)])
def test_a_server_that_keeps_failing_is_unavailable_a_refused_request_is_not(status, unavailable):
    with StubServer(lambda request: (status, "{}")) as server:
        result = _backend(server.url, max_retries=1).chat([[{"role": "user", "content": "hi"}]])[0]
    assert result.error and result.unavailable is unavailable


def test_an_unreachable_server_is_unavailable_and_an_empty_reply_is_not():
    dead = _backend("http://127.0.0.1:9/v1", max_retries=1).chat([[{"role": "user", "content": "hi"}]])[0]
    assert dead.error and dead.unavailable
    with StubServer(lambda request: completion("   ")) as server:
        empty = _backend(server.url, max_retries=1).chat([[{"role": "user", "content": "hi"}]])[0]
    assert empty.error and not empty.unavailable
