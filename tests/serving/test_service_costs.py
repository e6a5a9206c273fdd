"""What a request body may cost: a body's shape (millions of tiny objects) is bounded before it is
parsed, a large body is parsed without stalling the event loop, and imports run a few at a time."""

from __future__ import annotations

import threading
import time

import httpx
import pytest

pytest.importorskip("fastapi")

from qgmem.serving.requests import Limits
from qgmem.serving.server import create_app

from .server_helpers import running
from .test_server import _service, pipeline  # noqa: F401  (fixture)

JSON = {"content-type": "application/json"}


def _tiny_entries(n: int) -> bytes:
    return b'{"format": "qgmem-user-export", "version": 1, "entries": [' + b",".join([b"{}"] * n) + b"]}"


def _while_posting(url: str, path: str, body, **kwargs) -> tuple[httpx.Response, float, list[float]]:
    """``body`` posted in a thread while /healthz is asked again and again: the reply, its seconds, and
    the seconds of each /healthz."""
    done: dict = {}

    def post():
        started = time.monotonic()
        done["reply"] = httpx.post(url + path, content=body, headers=JSON, timeout=300, **kwargs)
        done["seconds"] = time.monotonic() - started

    thread = threading.Thread(target=post)
    thread.start()
    health = []
    while thread.is_alive():
        started = time.monotonic()
        assert httpx.get(f"{url}/healthz", timeout=300).status_code == 200
        health.append(time.monotonic() - started)
        time.sleep(0.02)
    thread.join()
    return done["reply"], done["seconds"], health


def test_an_import_of_millions_of_tiny_entries_is_refused_at_once_and_health_answers(pipeline, tmp_path):  # noqa: F811
    """Was: 5 million ``{}`` (15 MB, within the import's byte limit) parsed on the event loop, each element
    given a path string: a 400 after 27 s with /healthz stalled as long (2 shared cores), and about
    72 times the body in memory."""
    service = _service(pipeline, tmp_path)
    body = _tiny_entries(5_000_000)
    with running(create_app(service)) as url:
        reply, seconds, health = _while_posting(url, "/v1/users/mallory/import", body)
    assert reply.status_code == 413, reply.text
    message = reply.json()["error"]["message"]
    assert "objects and arrays" in message and f"limit of {Limits().max_json_containers}" in message
    assert seconds < 5.0, seconds
    assert max(health) < 1.5, health  # was 27 s here; the bound leaves room for a loaded machine
    assert not service.users.exists("mallory")


def test_a_large_import_is_parsed_off_the_event_loop(pipeline, tmp_path):  # noqa: F811
    """An import within every bound but large (200,000 tiny sessions, 600,000 objects): /healthz answers
    while it is parsed and checked (was: one /healthz of 8 s; the bound leaves room for the
    collector's pauses on a loaded machine)."""
    service = _service(pipeline, tmp_path)
    entry = b'{"turns": [{"speaker": "U", "text": "x"}], "time": "2024-05-01"}'
    body = b'{"format": "qgmem-user-export", "version": 1, "entries": [' + b",".join([entry] * 200_000) + \
        b', {"turns": []}]}'
    with running(create_app(service)) as url:
        reply, _, health = _while_posting(url, "/v1/users/mallory/import", body)
    assert reply.status_code == 400 and "entries[200000]: field 'turns'" in reply.json()["error"]["message"], reply.text
    assert len(health) > 2 and max(health) < 2.5, health


def test_imports_run_a_few_at_a_time(pipeline, tmp_path):  # noqa: F811
    """An import past ``max_concurrent_imports`` is refused at once with 503 and Retry-After."""
    service = _service(pipeline, tmp_path, limits=Limits(max_concurrent_imports=1, body_timeout_s=20))
    release = threading.Event()

    def slow_body():
        yield b'{"format": "qgmem-user-export", "version": 1, '
        release.wait(20)
        yield b'"entries": []}'

    with running(create_app(service)) as url:
        first: dict = {}
        thread = threading.Thread(target=lambda: first.setdefault(
            "reply", httpx.post(f"{url}/v1/users/slow/import", content=slow_body(), headers=JSON, timeout=60)))
        thread.start()
        deadline = time.monotonic() + 20
        while service.imports_running() < 1 and time.monotonic() < deadline:
            time.sleep(0.02)
        started = time.monotonic()
        second = httpx.post(f"{url}/v1/users/other/import", content=_tiny_entries(0), headers=JSON, timeout=60)
        refused_in = time.monotonic() - started
        release.set()
        thread.join()
    assert second.status_code == 503 and second.headers["retry-after"] == "1", second.text
    assert "imports" in second.json()["error"]["message"] and refused_in < 2.0
    assert first["reply"].status_code == 200, first["reply"].text
