"""Reliability on the real databases: two replicas (processes) of 8 threads appending to one user; a
Postgres restart while serving (503s, then served again without restarting the service); a full disk
under SQLite (a clear 5xx, nothing acknowledged lost). The kills before and after each commit are in
``test_users_changes.py``."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import pytest

pytest.importorskip("fastapi")

from qgmem.serving.server import MemoryService, create_app
from qgmem.serving.users import UserMemories

from .conftest import Postgres
from .server_helpers import running
from .test_server import ALICE, pipeline  # noqa: F401  (fixture)
from .test_users import _Models

_REPLICA = """
import json, sys
from concurrent.futures import ThreadPoolExecutor
from serving.test_users import _Models
from qgmem.serving.users import UserMemories
url, name = sys.argv[1], sys.argv[2]
users = UserMemories(url, _Models())
def work(thread):
    out = []
    for n in range(3):
        text = f"Replica {name} thread {thread} planted {n} tulips."
        key = f"{name}-{thread}-{n}"
        first = users.append("ana", [{"speaker": "User", "text": text}], None, key)
        again = users.append("ana", [{"speaker": "User", "text": text}], None, key)  # a client's retry
        out.append([first["session"], again.get("replayed", False), again["session"]])
    return out
with ThreadPoolExecutor(8) as pool:
    results = [r for rs in pool.map(work, range(8)) for r in rs]
print(json.dumps({"results": results, "retried": users.retried_writes}))
"""


def _replicas(url: str) -> list[dict]:
    tests = Path(__file__).resolve().parents[1]
    env = {**os.environ, "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join([str(tests.parent / "src"), str(tests), os.environ.get("PYTHONPATH", "")])}
    procs = [subprocess.Popen([sys.executable, "-c", _REPLICA, url, name], stdout=subprocess.PIPE, env=env, text=True)
             for name in ("A", "B")]
    outs = [p.communicate(timeout=600)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    return [json.loads(out.strip().splitlines()[-1]) for out in outs]


def test_two_replicas_of_8_threads_appending_to_one_user_lose_and_double_nothing(store_url):
    UserMemories(store_url, _Models()).store.close()  # the schema made once, before the replicas start
    replies = _replicas(store_url)
    sessions = [r[0] for reply in replies for r in reply["results"]]
    assert sorted(sessions) == list(range(48))  # each acknowledged append has its own place
    assert all(replayed and again == first for reply in replies for first, replayed, again in reply["results"])
    users = UserMemories(store_url, _Models())
    texts = [e["turns"][0]["text"] for e in users.store.changes("ana", 0)]
    expected = {f"Replica {r} thread {t} planted {n} tulips." for r in "AB" for t in range(8) for n in range(3)}
    assert len(texts) == 48 and set(texts) == expected  # none lost, none twice
    assert len(users.get("ana").store) == 48  # the memory built from them holds each once
    assert users.store.changes("ana", 0) == [{"turns": [{"speaker": "User", "text": t}], "time": None}
                                              for t in texts]


def _service(pipeline, url: str) -> MemoryService:  # noqa: F811
    import copy

    pipe = copy.copy(pipeline)
    pipe._builder = None
    return MemoryService(pipe, url)


def test_a_postgres_restart_gives_503s_then_recovers_without_restarting_serve(pipeline):  # noqa: F811
    folder = Path(tempfile.mkdtemp(prefix="qgmem-pg-restart-"))
    try:
        server = Postgres(folder)
    except Exception as exc:  # noqa: BLE001
        if os.environ.get("CI") == "true":
            pytest.fail(f"PostgreSQL did not start, and CI=true: {exc}")
        pytest.skip(f"PostgreSQL did not start here: {exc}")
    try:
        service = _service(pipeline, server.database())
        with running(create_app(service)) as url:
            assert httpx.post(f"{url}/v1/users/alice/sessions", json={"turns": ALICE[:1]}).status_code == 200
            server.stop()
            down = [httpx.post(f"{url}/v1/users/alice/sessions", json={"turns": ALICE[1:2]}, timeout=60),
                    httpx.get(f"{url}/v1/users/alice/memories", timeout=60)]
            assert [r.status_code for r in down] == [503, 503], [r.text for r in down]
            assert all(r.headers["retry-after"] == "1" and "unavailable" in r.json()["error"]["message"] for r in down)
            assert httpx.get(f"{url}/healthz").status_code == 200  # the service lives on
            server = Postgres(folder)  # the same data folder: the database is back
            deadline, statuses = time.monotonic() + 60, []
            while time.monotonic() < deadline:
                r = httpx.post(f"{url}/v1/users/alice/sessions", json={"turns": ALICE[1:2]}, timeout=60)
                statuses.append(r.status_code)
                if r.status_code == 200:
                    break
                time.sleep(0.5)
            assert statuses[-1] == 200 and set(statuses) <= {200, 503}, statuses
            assert r.json()["session"] == 1  # the session refused while it was down was not stored
            memories = httpx.get(f"{url}/v1/users/alice/memories").json()
            assert memories["sessions"] == 2
        service.users.store.close()
    finally:
        server.stop()
        shutil.rmtree(folder, ignore_errors=True)


def test_a_full_disk_under_sqlite_is_a_clear_5xx_and_loses_nothing_acknowledged(pipeline, tmp_path):  # noqa: F811
    disk = tmp_path / "disk"
    disk.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=3m", "tmpfs", str(disk)], capture_output=True)
    if mounted.returncode != 0:
        pytest.skip(f"a small file system cannot be mounted here (needs root): {mounted.stderr.decode().strip()}")
    try:
        url = f"sqlite:///{disk / 'memories.db'}"
        service = _service(pipeline, url)
        acknowledged, failures = [], []
        with running(create_app(service)) as base:
            for n in range(400):
                turns = [{"speaker": "User", "text": f"Note {n}: " + "the marigold shed needs paint. " * 40}]
                r = httpx.post(f"{base}/v1/users/alice/sessions", json={"turns": turns}, timeout=60)
                if r.status_code == 200:
                    acknowledged.append(r.json()["session"])
                else:
                    failures.append(r)
                    if len(failures) == 2:
                        break
            assert failures, "the disk never filled"
            assert all(r.status_code == 507 and "disk is full" in r.json()["error"]["message"]
                       and "nothing of this request was stored" in r.json()["error"]["message"] for r in failures)
            assert httpx.get(f"{base}/healthz").status_code == 200
        service.users.store.close()
        reopened = UserMemories(url, _Models())
        assert len(reopened.store.changes("alice", 0)) == len(acknowledged) == acknowledged[-1] + 1 > 0
        reopened.store.close()
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=False)
