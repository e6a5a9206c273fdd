"""A running ``qgmem serve`` app for tests: uvicorn in a thread on a free port, or the CLI in a subprocess."""

from __future__ import annotations

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


def start_cli(export: Path, store_root: Path, *extra: str, env: dict | None = None):
    """``python -m qgmem serve`` in a subprocess; returns ``(process, base URL)`` once /healthz answers."""
    port = free_port()
    src = str(Path(__file__).resolve().parents[2] / "src")
    full_env = {**os.environ, "PYTHONPATH": src + os.pathsep + os.environ.get("PYTHONPATH", ""),
                "OMP_NUM_THREADS": "1", **(env or {})}
    proc = subprocess.Popen([sys.executable, "-m", "qgmem", "serve", "--export", str(export), "--store-root",
                             str(store_root), "--port", str(port), *extra],
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
