from __future__ import annotations

import pytest

from qgmem.llm.backends import CachedBackend, CallableBackend

PROMPTS = [[{"role": "user", "content": f"question {i}"}] for i in range(5)]


def _echo(messages):
    return f"answer to {messages[-1]['content']}"


def test_replay_makes_zero_calls_and_returns_the_same(tmp_path):
    first = CachedBackend(CallableBackend(_echo, "m"), tmp_path / "cache.sqlite")
    original = first.chat(PROMPTS, max_new_tokens=64)
    assert first.inner.usage.calls == 5 and not any(r.cached for r in original) and len(first) == 5
    first.close()

    def must_not_be_called(messages):
        raise AssertionError("the cache should have answered")

    again = CachedBackend(CallableBackend(must_not_be_called, "m"), tmp_path / "cache.sqlite")
    replay = again.chat(PROMPTS, max_new_tokens=64)
    assert [r.text for r in replay] == [r.text for r in original]
    assert [(r.prompt_tokens, r.completion_tokens) for r in replay] == [
        (r.prompt_tokens, r.completion_tokens) for r in original]
    assert all(r.cached for r in replay)
    assert again.inner.usage.calls == 0 and again.usage.cache_hits == 5 and again.usage.calls == 0


@pytest.mark.parametrize("change", ["model", "max_new_tokens", "temperature", "messages"])
def test_key_covers_model_params_and_messages(tmp_path, change):
    cache = tmp_path / "cache.sqlite"
    CachedBackend(CallableBackend(_echo, "m"), cache).chat(PROMPTS[:1], max_new_tokens=64)
    backend = CachedBackend(CallableBackend(_echo, "other" if change == "model" else "m"), cache)
    prompts = [[{"role": "user", "content": "different"}]] if change == "messages" else PROMPTS[:1]
    backend.chat(prompts, max_new_tokens=32 if change == "max_new_tokens" else 64,
                 temperature=0.7 if change == "temperature" else 0.0)
    assert backend.inner.usage.calls == 1 and backend.usage.cache_hits == 0


def test_errors_are_not_cached_and_are_asked_again(tmp_path):
    calls = []

    def flaky(messages):
        calls.append(messages)
        if len(calls) == 1:
            raise TimeoutError("model busy")
        return "fine"

    backend = CachedBackend(CallableBackend(flaky, "m"), tmp_path / "c.sqlite")
    [first] = backend.chat(PROMPTS[:1])
    [second] = backend.chat(PROMPTS[:1])
    assert first.error == "TimeoutError: model busy" and second.text == "fine" and not second.cached
    assert len(backend) == 1 and backend.usage.errors == 1


def test_duplicates_in_one_batch_are_asked_once(tmp_path):
    backend = CachedBackend(CallableBackend(_echo, "m"), tmp_path / "c.sqlite")
    results = backend.chat([PROMPTS[0], PROMPTS[1], PROMPTS[0]])
    assert backend.inner.usage.calls == 2
    assert results[0].text == results[2].text == "answer to question 0" and results[2].cached


class _Killed(BaseException):
    """Stands in for the process being killed mid-build (not an Exception: nothing may swallow it)."""


def test_chunks_are_committed_so_an_interrupted_batch_resumes(tmp_path):
    seen = []

    def dies_on_fourth(messages):
        seen.append(messages)
        if len(seen) == 4:
            raise _Killed()
        return _echo(messages)

    backend = CachedBackend(CallableBackend(dies_on_fourth, "m"), tmp_path / "c.sqlite", chunk_size=2)
    with pytest.raises(_Killed):
        backend.chat(PROMPTS)
    resumed = CachedBackend(CallableBackend(_echo, "m"), tmp_path / "c.sqlite", chunk_size=2)
    results = resumed.chat(PROMPTS)
    assert resumed.inner.usage.calls == 3 and resumed.usage.cache_hits == 2  # first chunk survived
    assert [r.text for r in results] == [_echo(p) for p in PROMPTS]


def _slow_echo(calls, release=None):
    def fn(messages):
        calls.append(messages[-1]["content"])
        if release is not None:
            release.wait(5)
        return _echo(messages)
    return fn


def test_a_request_in_flight_on_another_thread_is_waited_for_not_asked_twice(tmp_path):
    import threading
    from concurrent.futures import ThreadPoolExecutor

    calls, release = [], threading.Event()
    backend = CachedBackend(CallableBackend(_slow_echo(calls, release), "m"), tmp_path / "c.sqlite")
    with ThreadPoolExecutor(3) as callers:
        futures = [callers.submit(backend.chat, [PROMPTS[0], PROMPTS[i]]) for i in (1, 2, 3)]
        while len(calls) < 1:  # the first caller is asking question 0; the others wait for it
            threading.Event().wait(0.01)
        threading.Event().wait(0.1)
        release.set()
        results = [f.result() for f in futures]
    assert sorted(calls) == ["question 0", "question 1", "question 2", "question 3"]
    assert all(r[0].text == "answer to question 0" for r in results)
    assert sum(not r[0].cached for r in results) == 1 and backend.usage.cache_hits == 2
    assert backend.usage_here().requests == 0  # the calls were made on the callers' threads, not this one


def test_a_reply_that_failed_for_the_thread_that_asked_is_asked_again(tmp_path):
    import threading
    from concurrent.futures import ThreadPoolExecutor

    calls, release = [], threading.Event()

    def fails_first(messages):
        calls.append(1)
        release.wait(5)
        if len(calls) == 1:
            raise TimeoutError("model busy")
        return _echo(messages)

    backend = CachedBackend(CallableBackend(fails_first, "m"), tmp_path / "c.sqlite")
    with ThreadPoolExecutor(2) as callers:
        first = callers.submit(backend.chat, [PROMPTS[0]])
        while not calls:
            threading.Event().wait(0.01)
        second = callers.submit(backend.chat, [PROMPTS[0]])
        threading.Event().wait(0.1)
        release.set()
        [a], [b] = first.result(), second.result()
    # the waiting caller got the failure handed over and asked itself, as it would after a serial failure
    assert a.error == "TimeoutError: model busy" and b.text == _echo(PROMPTS[0]) and b.error is None
    assert len(calls) == 2 and len(backend) == 1


def test_usage_here_counts_the_calling_thread_only(tmp_path):
    from concurrent.futures import ThreadPoolExecutor

    backend = CallableBackend(_echo, "m")
    backend.chat(PROMPTS[:2])
    with ThreadPoolExecutor(1) as other:
        there = other.submit(lambda: (backend.chat(PROMPTS), backend.usage_here().requests)[1]).result()
    assert there == 5 and backend.usage_here().requests == 2 and backend.usage.requests == 7
