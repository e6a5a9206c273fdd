"""``qgmem serve`` as a process: SIGKILL during appends loses nothing acknowledged, restarts serve the
same memories, and neither the key nor request bodies reach the log."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

import httpx
import pytest

pytest.importorskip("fastapi")

from qgmem.memory.config import ConstructionConfig
from qgmem.serving.storage import open_store

from .helpers import make_export
from .server_helpers import start_cli

KEY = "k-very-secret-123"
AUTH = {"Authorization": f"Bearer {KEY}"}


def _session(n: int, turns: int = 1) -> dict:
    return {"turns": [{"speaker": "User", "text": f"In session {n} I planted {n + t} tulips by the marigold shed."}
                      for t in range(turns)]}


def _stop(proc) -> str:
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
    return proc.stdout.read()


def test_sigkill_mid_append_loses_nothing_acknowledged_and_restart_serves_the_same(tmp_path, tiny_lm_path):
    export = make_export(tmp_path / "export", tiny_lm_path, feature_dim=384,
                         construction=ConstructionConfig(extractor="heuristic").to_dict())
    root = f"sqlite:///{tmp_path / 'memories' / 'memories.db'}"
    env = {"QGMEM_TEST_KEY": KEY}
    proc, url = start_cli(export, root, "--api-key-env", "QGMEM_TEST_KEY", env=env)
    acked, logs = [], ""
    try:
        for n in range(3):
            r = httpx.post(f"{url}/v1/users/ana/sessions", json=_session(n), headers=AUTH, timeout=60)
            assert r.status_code == 200, r.text
            acked.append(r.json()["session"])
        before = httpx.post(f"{url}/v1/users/ana/answer", json={"question": "How many tulips did I plant?"},
                            headers=AUTH, timeout=60).json()

        def big_append():  # 200 turns: construction takes well over the 0.3 s before the kill
            try:
                r = httpx.post(f"{url}/v1/users/ana/sessions", json=_session(3, turns=200), headers=AUTH, timeout=60)
                acked.append(r.json()["session"])
            except httpx.HTTPError:
                pass

        writer = threading.Thread(target=big_append)
        writer.start()
        time.sleep(0.3)
        os.kill(proc.pid, signal.SIGKILL)
        writer.join(timeout=60)
        logs += proc.stdout.read()
        proc.wait()
    finally:
        if proc.poll() is None:
            proc.kill()
    store = open_store(root)
    whole = store.changes("ana", 0)
    loaded = store.load("ana")
    store.close()
    assert len(whole) >= len(acked) == max(acked) + 1, "an acknowledged session is missing from the store"
    assert len(whole) in (3, 4) and [e["turns"] for e in whole[:3]] == [_session(n)["turns"] for n in range(3)]
    assert loaded[2] is not None and loaded[1] == len(whole)  # the snapshot is committed with its change

    proc, url = start_cli(export, root, "--api-key-env", "QGMEM_TEST_KEY", env=env)
    try:
        after = httpx.post(f"{url}/v1/users/ana/answer", json={"question": "How many tulips did I plant?"},
                           headers=AUTH, timeout=60).json()
        nxt = httpx.post(f"{url}/v1/users/ana/sessions", json=_session(99), headers=AUTH, timeout=60).json()
    finally:
        logs += _stop(proc)
    assert nxt["session"] == len(whole), "the restart did not serve every durable session"
    if len(whole) == 3:  # the killed append was not committed: the same memory as before the kill
        assert after["memory"] == before["memory"] and after["answer"] == before["answer"]
    assert KEY not in logs and "tulips" not in logs and "marigold" not in logs
    assert "POST /v1/users/ana/sessions" in logs  # request lines are logged: method, path, status only


def test_serve_flags_follow_the_cli_conventions(tmp_path, monkeypatch, capsys):
    from qgmem.cli import main

    monkeypatch.delenv("QGMEM_UNSET_KEY_VARIABLE", raising=False)
    assert main(["serve", "--export", str(tmp_path), "--api-key-env", "QGMEM_UNSET_KEY_VARIABLE"]) == 2
    err = capsys.readouterr().err
    assert "QGMEM_UNSET_KEY_VARIABLE" in err and "Traceback" not in err
    assert main(["serve", "--export", "x", "--port", "0"]) == 2
    assert "--port must be in 1..65535" in capsys.readouterr().err
    (tmp_path / "serve.yaml").write_text("max_batch: 4\nport: 9000\n")
    assert main(["serve", "--config", str(tmp_path / "serve.yaml"), "--export", "x", "--port", "9001",
                 "--print_config"]) == 0
    import yaml

    printed = yaml.safe_load(capsys.readouterr().out)
    assert (printed["max_batch"], printed["port"], printed["host"], printed["threads"]) == (4, 9001, "127.0.0.1", None)
    (tmp_path / "bad.yaml").write_text("max_batchs: 4\n")
    assert main(["serve", "--config", str(tmp_path / "bad.yaml"), "--export", "x"]) == 2
    err = capsys.readouterr().err
    assert "max_batchs" in err and "Traceback" not in err
    assert main(["serve", "--export", "x", "--max-batch", "many"]) == 2  # typed from ServeSettings' hints
    err = capsys.readouterr().err
    assert "max_batch" in err and "Traceback" not in err
    assert main(["serve", "--help"]) == 0
    out = capsys.readouterr().out
    assert "--store" in out and "sqlite:///memories/memories.db" in out and "--print_config" in out and "questions answered in one LM forward" in out
    assert "--store-root" not in out  # retired: named by its successor when given
    assert main(["serve", "--export", "x", "--store-root", "memories"]) == 2
    err = capsys.readouterr().err
    assert "--store-root was retired" in err and "--store sqlite:///" in err and "migrate-store" in err
    assert "Traceback" not in err
    assert main(["serve", "--export", "x", "--store", "memories/db"]) == 2
    assert "not a store URL" in capsys.readouterr().err
