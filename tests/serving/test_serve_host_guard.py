"""``qgmem serve`` on this machine only answers requests that name this machine (no DNS rebinding)."""

from __future__ import annotations

from fastapi import FastAPI
from fastapi.testclient import TestClient

from qgmem.serving.serve_cli import guard_host


def _app(host: str) -> FastAPI:
    app = FastAPI()
    app.get("/healthz")(lambda: {"ok": True})
    guard_host(app, host)
    return app


def test_a_loopback_server_refuses_another_host_name():
    client = TestClient(_app("127.0.0.1"), base_url="http://127.0.0.1:8000")
    assert client.get("/healthz").status_code == 200
    assert client.get("/healthz", headers={"Host": "localhost:8000"}).status_code == 200
    assert client.get("/healthz", headers={"Host": "[::1]:8000"}).status_code == 200
    refused = client.get("/healthz", headers={"Host": "attacker.example:8000"})
    assert refused.status_code == 400


def test_a_server_bound_elsewhere_leaves_host_names_to_its_proxy():
    client = TestClient(_app("0.0.0.0"), base_url="http://10.0.0.5:8000")
    assert client.get("/healthz", headers={"Host": "memory.internal"}).status_code == 200
