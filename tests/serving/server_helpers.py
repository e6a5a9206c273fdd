"""A running ``qgmem serve`` app for tests: uvicorn in a thread on a free port, or the CLI in a subprocess."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path

import httpx


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def running(app):
    """``app`` served by uvicorn in a thread; yields its base URL, stops it after."""
    import uvicorn

    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("the server did not start")
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=30)


def start_cli(export: Path, store: str, *extra: str, env: dict | None = None):
    """``python -m qgmem serve`` in a subprocess; returns ``(process, base URL)`` once /healthz answers."""
    port = free_port()
    src = str(Path(__file__).resolve().parents[2] / "src")
    full_env = {**os.environ, "PYTHONPATH": src + os.pathsep + os.environ.get("PYTHONPATH", ""),
                "OMP_NUM_THREADS": "1", **(env or {})}
    proc = subprocess.Popen([sys.executable, "-m", "qgmem", "serve", "--export", str(export), "--store",
                             str(store), "--port", str(port), *extra],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=full_env, text=True)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"qgmem serve exited with {proc.returncode}: {proc.stdout.read()}")
        try:
            if httpx.get(f"{url}/healthz", timeout=1.0).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            time.sleep(0.2)
    proc.kill()
    raise RuntimeError("qgmem serve did not answer /healthz within 120 s")


_ZYGOTE = """
import json, os, signal, sys, traceback
exec(sys.argv[1])
from qgmem.serving.storage.base import SqlStore
print("ready", flush=True)
for request in sys.stdin:
    job = json.loads(request)
    pid = os.fork()
    if pid == 0:
        try:
            exec(job["setup"])
            calls = [0]
            real = SqlStore._run
            def counted(self, cur, sql, params=()):
                out = real(self, cur, sql, params)
                calls[0] += 1
                if calls[0] == job["step"]:
                    os.kill(os.getpid(), signal.SIGKILL)
                return out
            SqlStore._run = counted
            exec(job["operation"])
        except BaseException:
            traceback.print_exc()
            os._exit(3)
        os._exit(0)
    _, status = os.waitpid(pid, 0)
    print("killed" if os.WIFSIGNALED(status) else "finished" if os.WEXITSTATUS(status) == 0 else "failed", flush=True)
"""


class KillRig:
    """Runs an operation killed (SIGKILL) just after its n-th SQL statement (so before each statement that
    follows and before the commit; a run that finishes is past the commit), in a child forked from a
    process that has only imported (``imports``, Python source): the children start in milliseconds, and
    no thread pool or connection of a test run is forked."""

    def __init__(self, imports: str):
        tests = Path(__file__).resolve().parents[1]
        env = {**os.environ, "OMP_NUM_THREADS": "1",
               "PYTHONPATH": os.pathsep.join([str(tests.parent / "src"), str(tests), os.environ.get("PYTHONPATH", "")])}
        self.proc = subprocess.Popen([sys.executable, "-c", _ZYGOTE, imports], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, env=env, text=True)
        assert self.proc.stdout.readline().strip() == "ready"

    def run(self, step: int, setup: str, operation: str) -> bool:
        """``setup`` then ``operation``, killed after the ``step``-th statement of ``operation``; True
        when it ran to its end (it ran fewer statements)."""
        self.proc.stdin.write(json.dumps({"step": step, "setup": setup, "operation": operation}) + "\n")
        self.proc.stdin.flush()
        outcome = self.proc.stdout.readline().strip()
        assert outcome in ("killed", "finished"), f"the operation failed (not killed) at step {step}"
        return outcome == "finished"

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(timeout=30)
