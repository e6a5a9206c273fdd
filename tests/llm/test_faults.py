"""LLM backend faults: empty or unusable replies are failures that are retried, counted and never
cached; a trickling server cannot outlive the overall deadline; ``--refresh-llm-cache`` drops a range."""

from __future__ import annotations

import json
import socket
import sqlite3
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from qgmem.errors import UserError
from qgmem.llm.backends import CachedBackend, CallableBackend, LLMConfig, OpenAIChatBackend
from qgmem.llm.cache import KeyRange, cache_key
from qgmem.llm.parsing import extract_json

from .helpers import StubServer, completion

MSG = [[{"role": "user", "content": "hello"}]]


def _backend(url: str, **overrides) -> OpenAIChatBackend:
    settings = {"backoff_s": 0.0, "max_retries": 2, "timeout_s": 2.0, **overrides}
    return OpenAIChatBackend(LLMConfig(backend="openai", model="stub-model", base_url=url, **settings),
                             sleep=lambda s: None)


@pytest.mark.parametrize("content", ["", "   \n", "<think>still thinking</think>"])
def test_empty_http_reply_is_retried_counted_and_not_cached(tmp_path, content):
    with StubServer(lambda req: completion(content)) as server:
        backend = CachedBackend(_backend(server.url), tmp_path / "c.sqlite")
        [result] = backend.chat(MSG)
        assert len(server.requests) == 3 and backend.inner.usage.retries == 2  # asked 1 + max_retries times
    assert not result.ok and len(backend) == 0
    assert "empty reply" in result.error
    assert backend.usage.errors == 1
    with StubServer(lambda req: completion("a real answer")) as healthy:  # a later run, healthy server
        backend = CachedBackend(_backend(healthy.url), tmp_path / "c.sqlite")
        [again] = backend.chat(MSG)
    assert again.text == "a real answer" and not again.cached and len(healthy.requests) == 1 and len(backend) == 1


def test_empty_then_good_reply_succeeds_on_retry():
    script = iter([completion(""), completion("ok")])
    with StubServer(lambda req: next(script)) as server:
        backend = _backend(server.url)
        [result] = backend.chat(MSG)
    assert result.text == "ok" and result.ok and backend.usage.retries == 1 and len(server.requests) == 2


@pytest.mark.parametrize("reply", ["", "  ", "<think>only reasoning</think>\n"])
def test_any_backend_empty_reply_is_a_failure(reply):
    backend = CallableBackend(lambda messages: reply)
    [result] = backend.chat(MSG)
    assert not result.ok and result.unusable and "empty reply" in result.error
    assert backend.usage.unusable == 1 and backend.usage.errors == 1


def _units(text: str) -> list:
    value = extract_json(text)["units"]
    if not isinstance(value, list):
        raise ValueError("units must be a list")
    return value


def test_rejected_reply_at_temperature_0_is_replayed_rejected(tmp_path):
    replies = iter(['{"units": "nope"}', '{"units": []}'])
    inner = CallableBackend(lambda messages: next(replies))
    backend = CachedBackend(inner, tmp_path / "c.sqlite")
    [bad] = backend.chat(MSG, validate=_units)
    assert bad.unusable and bad.text == '{"units": "nope"}' and "units must be a list" in bad.error
    assert len(backend) == 1 and backend.usage.unusable == 1 and inner.usage.unusable == 1
    # the model would give the same reply at temperature 0: replayed, and rejected again, for nothing
    [again] = CachedBackend(inner, tmp_path / "c.sqlite").chat(MSG, validate=_units)
    assert again.cached and again.unusable and again.text == bad.text and again.error == bad.error
    assert inner.usage.calls == 1 and backend.dropped == 0
    # a check that now accepts it uses it as it is
    [accepted] = backend.chat(MSG, validate=lambda text: None)
    assert accepted.ok and accepted.cached and inner.usage.calls == 1
    # --refresh-llm-cache rejected: asked again, and the good reply replaces it
    assert backend.drop("rejected") == 1 and len(backend) == 0
    [good] = backend.chat(MSG, validate=_units)
    assert good.ok and not good.cached and good.text == '{"units": []}' and inner.usage.calls == 2
    [replayed] = backend.chat(MSG, validate=_units)
    assert replayed.cached and replayed.ok and inner.usage.calls == 2 and backend.drop("rejected") == 0


def test_rejected_reply_above_temperature_0_is_asked_again(tmp_path):
    replies = iter(['{"units": "nope"}', '{"units": []}'])
    inner = CallableBackend(lambda messages: next(replies))
    backend = CachedBackend(inner, tmp_path / "c.sqlite")
    [bad] = backend.chat(MSG, validate=_units, temperature=0.7)
    assert bad.unusable and len(backend) == 0  # another sample may parse: not kept
    [good] = backend.chat(MSG, validate=_units, temperature=0.7)
    assert good.ok and not good.cached and inner.usage.calls == 2 and len(backend) == 1


def test_empty_reply_is_never_stored_even_at_temperature_0(tmp_path):
    replies = iter(["  ", "<think>hmm</think>", '{"units": []}'])
    inner = CallableBackend(lambda messages: next(replies))
    backend = CachedBackend(inner, tmp_path / "c.sqlite")
    assert backend.chat(MSG, validate=_units)[0].unusable and len(backend) == 0
    assert backend.chat(MSG, validate=_units)[0].unusable and len(backend) == 0
    assert backend.chat(MSG, validate=_units)[0].ok and inner.usage.calls == 3 and len(backend) == 1


def test_per_conversation_validators():
    backend = CallableBackend(lambda messages: messages[0]["content"])
    convs = [[{"role": "user", "content": '{"units": []}'}], [{"role": "user", "content": "[1]"}]]
    results = backend.chat(convs, validate=[_units, lambda text: extract_json(text, expect=list)])
    assert [r.ok for r in results] == [True, True]
    results = backend.chat(convs, validate=[None, _units])
    assert [r.ok for r in results] == [True, False]
    with pytest.raises(ValueError, match="1 validators for 2 conversations"):
        backend.chat(convs, validate=[_units])


def test_bad_reply_stored_by_an_older_version_is_dropped_on_replay(tmp_path):
    path = tmp_path / "c.sqlite"
    inner = CallableBackend(lambda messages: '{"units": []}', model_id="m")
    key = cache_key(inner.name, inner.model_id, MSG[0], 512, 0.0)
    with sqlite3.connect(path) as db:  # the old schema, holding an empty reply
        db.execute("CREATE TABLE responses (key TEXT PRIMARY KEY, backend TEXT NOT NULL, model TEXT NOT NULL, "
                   "text TEXT NOT NULL, prompt_tokens INTEGER NOT NULL, completion_tokens INTEGER NOT NULL)")
        db.execute("INSERT INTO responses VALUES (?, ?, ?, ?, 1, 0)", (key, inner.name, inner.model_id, ""))
    backend = CachedBackend(inner, path)
    [result] = backend.chat(MSG, validate=_units)
    assert result.ok and not result.cached and backend.dropped == 1 and inner.usage.calls == 1
    [replayed] = backend.chat(MSG)
    assert replayed.cached and replayed.text == '{"units": []}'


def test_corrupt_cache_file_is_a_user_error(tmp_path):
    path = tmp_path / "c.sqlite"
    path.write_bytes(b"this is not a database" * 100)
    with pytest.raises(UserError, match="not a usable LLM response cache"):
        CachedBackend(CallableBackend(lambda m: "x"), path)


# --- overall deadline ------------------------------------------------------------------------------

class _Trickle:
    """A 127.0.0.1 server that sends headers, then one byte of the body every ``interval`` seconds.

    The body loop is bounded (``max_bytes``) and stops when the client goes away, so the test cannot hang.
    """

    def __init__(self, interval: float = 0.02, max_bytes: int = 400):
        body = json.dumps({"choices": [{"message": {"content": "x" * max_bytes}}]}).encode()
        self.sent = 0
        trickle = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802
                self.rfile.read(int(self.headers["Content-Length"]))
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                for i in range(min(len(body), max_bytes)):
                    try:
                        self.wfile.write(body[i:i + 1])
                        self.wfile.flush()
                    except (BrokenPipeError, ConnectionResetError, socket.timeout):
                        return
                    trickle.sent += 1
                    time.sleep(interval)

            def log_message(self, *args):
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        self.thread = threading.Thread(target=self.httpd.serve_forever, args=(0.02,), daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.httpd.shutdown()
        self.httpd.server_close()


def test_trickling_server_is_cut_at_the_overall_deadline(tmp_path):
    with _Trickle(interval=0.02, max_bytes=400) as server:  # 400 bytes would take 8 s; each read ~0.02 s
        backend = CachedBackend(_backend(server.url, timeout_s=1.0, deadline_s=0.5), tmp_path / "c.sqlite")
        started = time.monotonic()
        [result] = backend.chat(MSG)
        elapsed = time.monotonic() - started
    assert not result.ok and "deadline of 0.5s exceeded" in result.error and "bytes of the reply read" in result.error
    assert elapsed < 2.0 and 0 < server.sent < 400 and len(backend) == 0


def test_deadline_also_bounds_retries_and_backoff():
    waits = []
    config = LLMConfig(backend="openai", model="m", base_url="http://127.0.0.1:9/v1", max_retries=10,
                       backoff_s=0.3, deadline_s=1.0, timeout_s=0.2)
    with StubServer(lambda req: (503, "busy")) as server:
        config.base_url = server.url
        backend = OpenAIChatBackend(config, sleep=lambda s: (waits.append(s), time.sleep(s)))
        started = time.monotonic()
        [result] = backend.chat(MSG)
    assert "deadline of 1s exceeded after" in result.error and "HTTP 503" in result.error
    assert time.monotonic() - started < 1.5 and sum(waits) < 1.0 and len(server.requests) < 11


# --- --refresh-llm-cache ---------------------------------------------------------------------------

@pytest.fixture()
def filled(tmp_path):
    replies = {"a": "reply a", "b": "reply b", "c": "reply c", "d": "reply d"}
    inner = CallableBackend(lambda messages: replies[messages[0]["content"]], model_id="m1")
    backend = CachedBackend(inner, tmp_path / "c.sqlite")
    convs = [[{"role": "user", "content": k}] for k in replies]
    backend.chat(convs)
    keys = sorted(cache_key(inner.name, "m1", c, 512, 0.0) for c in convs)
    return backend, keys


def test_drop_all_and_by_model(filled):
    backend, keys = filled
    assert backend.drop("model=other") == 0 and len(backend) == 4
    assert backend.drop("model=m1") == 4 and len(backend) == 0


def test_drop_prefix_and_range(filled):
    backend, keys = filled
    assert backend.drop(keys[0][:6]) == 1 and len(backend) == 3
    assert backend.drop(f"{keys[1]}..{keys[3]}") == 2 and len(backend) == 1  # end exclusive
    assert backend.drop(f"..{keys[3]}") == 0 and backend.drop(f"{keys[3]}..") == 1


def test_drop_rejected_only(tmp_path):
    inner = CallableBackend(lambda messages: messages[0]["content"])
    backend = CachedBackend(inner, tmp_path / "c.sqlite")
    convs = [[{"role": "user", "content": '{"units": []}'}], [{"role": "user", "content": "prose"}]]
    assert [r.ok for r in backend.chat(convs, validate=_units)] == [True, False] and len(backend) == 2
    assert backend.drop("rejected") == 1 and len(backend) == 1
    assert backend.chat(convs[:1], validate=_units)[0].cached


def test_drop_since(filled, tmp_path):
    backend, _ = filled
    assert backend.drop(f"since={time.time() + 60:.0f}") == 0 and backend.drop("since=0") == 4


@pytest.mark.parametrize(("prefix", "start", "end"), [("ab", "ab", "ac"), ("af", "af", "b"), ("0f", "0f", "1"),
                                                      ("ff", "ff", None)])
def test_prefix_is_a_key_range(prefix, start, end):
    assert KeyRange.prefix(prefix) == KeyRange(start=start, end=end)


@pytest.mark.parametrize("spec", ["zz", "b..a", "since=yesterday", "0x12", ""])
def test_bad_refresh_spec_is_a_user_error(spec):
    with pytest.raises(UserError, match="--refresh-llm-cache"):
        KeyRange.parse(spec)


# --- secrets: a server that echoes the Authorization header ------------------------------------------

KEY = "sk-test-0123456789abcdefSECRET"


def echo_headers(holder: dict, status: int = 401):
    """A responder that puts the request's headers in its error body, as some proxies do."""
    def respond(request):
        headers = holder["server"].headers[-1]
        return status, json.dumps({"error": f"invalid key in Authorization: {headers['Authorization']}",
                                   "key": KEY, "received_headers": headers})
    return respond


@pytest.mark.parametrize("status", [401, 500])
def test_the_api_key_never_reaches_an_error_message(monkeypatch, status):
    monkeypatch.setenv("QGMEM_TEST_KEY", KEY)
    holder: dict = {}
    with StubServer(echo_headers(holder, status)) as server:
        holder["server"] = server
        backend = _backend(server.url, api_key_env="QGMEM_TEST_KEY", max_retries=1, backoff_s=0.0)
        [result] = backend.chat([[{"role": "user", "content": "hi"}]])
        backend.close()
    assert server.headers[0]["Authorization"] == f"Bearer {KEY}"  # the key was sent, and echoed back
    assert not result.ok and f"HTTP {status}" in result.error
    assert KEY not in result.error and KEY[:8] not in result.error and "Bearer [redacted]" in result.error


def test_redact_takes_out_keys_and_bearer_tokens_before_a_cut():
    from qgmem.llm.http import _excerpt, redact

    assert redact(f'{{"Authorization": "Bearer {KEY}"}} and {KEY}', (KEY,)) == \
        '{"Authorization": "Bearer [redacted]"} and [redacted]'
    assert redact("authorization: bearer abc.def-ghi") == "authorization: bearer [redacted]"
    cut = _excerpt(("y" * 190 + KEY).encode(), (KEY,))  # the cut would fall inside the key
    assert cut == "y" * 190 + "[redacted]" and KEY[:5] not in cut
