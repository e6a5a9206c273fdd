"""``qgmem.client`` against a live server (uvicorn over the real app): typed results sync and async, the
key from the environment, a retry after a dropped connection that stores nothing twice, a 503 retried
after its Retry-After, and no torch import."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

pytest.importorskip("fastapi")

from qgmem.client import AsyncMemoryClient, MemoryClient, ServiceError
from qgmem.serving.requests import Limits
from qgmem.serving.routes import protocol
from qgmem.serving.server import create_app

from .server_helpers import running
from .test_server import ALICE, _service, pipeline  # noqa: F401  (fixture)

KEY = "k3y"


@pytest.fixture
def served(pipeline, tmp_path, monkeypatch):  # noqa: F811
    monkeypatch.setenv("QGMEM_API_KEY", KEY)
    service = _service(pipeline, tmp_path, limits=Limits(max_concurrent_imports=1))
    with running(create_app(service, api_key=KEY)) as url:
        yield url, service


class DroppingProxy:
    """A TCP proxy in front of the server that drops its first ``drop`` connections once the server has
    begun its reply (the request was served; the client never sees the answer): a lost reply."""

    def __init__(self, target: str, drop: int = 1):
        self.target = target.rsplit(":", 1)
        self.drop, self.dropped = drop, 0
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.listener.getsockname()[1]}"
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _serve(self, client: socket.socket):
        upstream = socket.create_connection((self.target[0].split("//")[-1], int(self.target[1])))
        dropping = self.dropped < self.drop
        self.dropped += dropping
        threading.Thread(target=self._pipe, args=(client, upstream), daemon=True).start()
        if dropping:
            upstream.recv(1)  # the server's reply begins: the request was handled
            client.shutdown(socket.SHUT_RDWR)
            client.close()
            upstream.close()
            return
        self._pipe(upstream, client)

    @staticmethod
    def _pipe(source: socket.socket, sink: socket.socket):
        try:
            while data := source.recv(65536):
                sink.sendall(data)
        except OSError:
            pass
        for s in (source, sink):
            try:
                s.close()
            except OSError:
                pass

    def close(self):
        self.listener.close()


def test_typed_results_and_the_key_from_the_environment(served):
    url, _ = served
    with MemoryClient(url) as memory:
        stored = memory.remember("ana", ALICE, time="2024-05-01")
        assert isinstance(stored, protocol.Appended) and stored.session == 0 and stored.units_added > 0
        batch = memory.remember_many("ana", [{"turns": ALICE[:1]}, {"turns": ALICE[1:], "time": "2024-06-01"}])
        assert [s.session for s in batch.sessions] == [1, 2]
        found = memory.search("ana", "Where do I live?", limit=2)
        assert isinstance(found, protocol.SearchResult) and len(found.units) == 2 and found.units[0].unit_id
        answered = memory.answer("ana", "Where do I live?", graph_mode="none")
        assert isinstance(answered, protocol.AnswerResult) and answered.graph_mode == "none"
        listed = memory.memories("ana", limit=1000)
        assert listed.total == batch.units and len(listed.units) == batch.units
        gone = memory.forget("ana", listed.units[0].unit_id)
        assert gone.forgotten and gone.units == batch.units - 1
        document = memory.export("ana")
        assert document["format"] == "qgmem-user-export" and len(document["entries"]) == 4
        copy = memory.import_user("copy", document)
        assert copy.units == gone.units
        assert memory.delete("copy").deleted
        with pytest.raises(ServiceError) as refused:
            memory.remember("ana", [{"speaker": "User"}])
        assert refused.value.status == 400 and "turns[0]: field 'text'" in refused.value.message
        with pytest.raises(ServiceError) as missing:
            memory.memories("nobody")
        assert missing.value.status == 404
    with pytest.raises(ServiceError) as unauthorized:
        MemoryClient(url, api_key="wrong").memories("ana")
    assert unauthorized.value.status == 401


def test_the_async_client(served):
    url, _ = served

    async def run():
        async with AsyncMemoryClient(url) as memory:
            stored = await memory.remember("bo", ALICE)
            found, listed = await asyncio.gather(memory.search("bo", "What colour is my boat?"),
                                                 memory.memories("bo"))
            assert isinstance(found, protocol.SearchResult) and found.units
            assert listed.total == stored.units
            assert (await memory.forget("bo", listed.units[0].unit_id)).forgotten
            assert (await memory.delete("bo")).deleted

    asyncio.run(run())


def test_a_retry_after_a_dropped_connection_stores_the_session_once(served):
    url, service = served
    proxy = DroppingProxy(url, drop=1)
    try:
        with MemoryClient(proxy.url, backoff_s=0.05) as memory:
            stored = memory.remember("cy", ALICE)
    finally:
        proxy.close()
    assert proxy.dropped == 1  # the first reply was lost: the client retried with the same key
    assert stored.replayed and stored.session == 0
    with MemoryClient(url) as memory:
        assert memory.memories("cy").sessions == 1
    assert service.users.exists("cy")


def test_a_503_is_retried_after_its_retry_after(served):
    """An import while the one import slot is held: 503 with Retry-After 1, then served."""
    url, service = served
    release = threading.Event()

    def slow_body():
        yield b'{"format": "qgmem-user-export", "version": 1, '
        release.wait(20)
        yield b'"entries": []}'

    holder = threading.Thread(target=lambda: httpx.post(
        f"{url}/v1/users/slow/import", content=slow_body(), timeout=60,
        headers={"content-type": "application/json", "Authorization": f"Bearer {KEY}"}))
    holder.start()
    deadline = time.monotonic() + 20
    while service.imports_running() < 1 and time.monotonic() < deadline:
        time.sleep(0.02)
    threading.Timer(0.5, release.set).start()
    started = time.monotonic()
    with MemoryClient(url, backoff_s=0.01) as memory:
        imported = memory.import_user("dee", {"format": "qgmem-user-export", "version": 1,
                                              "entries": [{"turns": ALICE}]})
    waited = time.monotonic() - started
    holder.join()
    assert imported.imported and waited >= 0.9  # it waited the server's second, not the 10 ms backoff


def test_the_client_imports_no_torch():
    src = str(Path(__file__).resolve().parents[2] / "src")
    code = ("import sys, qgmem.client; "
            "print(json.dumps(sorted(m for m in ('torch', 'transformers', 'fastapi', 'lightning') "
            "if m in sys.modules)))")
    out = subprocess.run([sys.executable, "-c", "import json; " + code], capture_output=True, text=True, check=True,
                         env={**os.environ, "PYTHONPATH": src})
    assert json.loads(out.stdout) == []
