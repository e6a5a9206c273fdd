"""What clients and operators expect of the service: search for agents with their own LLM, paged
memories and deletion, the OpenAI models endpoints, refused parameters, strict fields, idempotent
appends, bounded resources (body deadline, unloading), nothing private in replies or logs."""

from __future__ import annotations

import json
import logging
import socket
import sqlite3
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

pytest.importorskip("fastapi")

from qgmem.serving.requests import Limits
from qgmem.serving.server import create_app

from .server_helpers import free_port, running
from .test_server import ALICE, BOB, _service, pipeline  # noqa: F401  (fixture)

MORE = [{"speaker": "User", "text": "I moved to Porto in March and my dog Biscuit loves the beach."}]


@pytest.fixture
def server(pipeline, tmp_path):  # noqa: F811
    service = _service(pipeline, tmp_path)
    with running(create_app(service)) as url:
        for turns in (ALICE, MORE):
            httpx.post(f"{url}/v1/users/alice/sessions", json={"turns": turns, "time": "2024-05-01"}).raise_for_status()
        yield url, service


# --------------------------------------------------------------------------------------------- search
def test_search_returns_the_working_memory_the_api_backbone_would_send_without_an_lm_call(server):
    from qgmem.serving.text_graph_backbone import TextGraphBackbone

    url, service = server
    batches, calls = service.batcher.batches, []
    real = service.pipeline.generate
    service.pipeline.generate = lambda *a, **k: calls.append(1) or real(*a, **k)
    r = httpx.post(f"{url}/v1/users/alice/search", json={"question": "Where do I live?", "time": "2024-06-01"})
    assert r.status_code == 200, r.text
    found = r.json()
    assert calls == [] and service.batcher.batches == batches  # no LM
    assert found["store_units"] > 0 and 0 < len(found["units"]) <= found["store_units"]
    unit = found["units"][0]
    assert {"label", "unit_id", "fact", "speaker", "fact_time", "utterance_time", "session_id", "source_turn_ids",
            "trace", "score"} <= set(unit) and unit["label"] == "M1"
    assert all(isinstance(u["score"], float) for u in found["units"])
    assert "lisbon" in " ".join(u["fact"].lower() for u in found["units"])
    # the text is what --backbone api sends for the same question over the same memory
    retrieved = service.retrieve("alice", "Where do I live?", "2024-06-01")
    block = TextGraphBackbone(backend=None, prompt=service.pipeline.prompt_settings).memory_block(retrieved, retrieved)
    assert found["memory_text"] == block and found["graph_text"] in block
    for colour in ("teal", "red"):  # a trace: the later value updates the earlier one
        httpx.post(f"{url}/v1/users/alice/sessions",
                   json={"turns": [{"speaker": "User", "text": f"My favourite colour is {colour}."}]}).raise_for_status()
    traced = httpx.post(f"{url}/v1/users/alice/search", json={"question": "What is my favourite colour?"}).json()
    states = {u["fact"]: u["trace"] for u in traced["units"] if u["trace"] is not None}
    assert states["User's favourite colour is red."]["transition"] == "update"
    assert states["User's favourite colour is red."]["current"] is True
    teal, red = states["User's favourite colour is teal."], states["User's favourite colour is red."]
    assert teal["trace_id"] == red["trace_id"] and teal["position"] < red["position"] == red["length"] - 1
    assert teal["current"] is False and teal["transition"] in ("origin", "supplement")
    assert found["graph"]["nodes"] and found["graph_text"]
    limited = httpx.post(f"{url}/v1/users/alice/search", json={"question": "What is my favourite colour?",
                                                                "limit": 1}).json()
    assert [u["unit_id"] for u in limited["units"]] == [traced["units"][0]["unit_id"]]
    assert httpx.post(f"{url}/v1/users/nobody/search", json={"question": "q"}).status_code == 404
    assert httpx.post(f"{url}/v1/users/alice/search", json={"question": "q", "limit": 0}).status_code == 400


# --------------------------------------------------------------------------------- memories, delete
def test_memories_are_paged_and_delete_removes_every_file_of_the_user(server, tmp_path):
    url, service = server
    httpx.post(f"{url}/v1/users/bob/sessions", json={"turns": BOB}).raise_for_status()
    whole = httpx.get(f"{url}/v1/users/alice/memories", params={"limit": 1000}).json()
    assert whole["total"] == len(whole["units"]) >= 3 and whole["sessions"] == 2
    page = httpx.get(f"{url}/v1/users/alice/memories", params={"offset": 1, "limit": 2}).json()
    assert [u["unit_id"] for u in page["units"]] == [u["unit_id"] for u in whole["units"][1:3]]
    assert httpx.get(f"{url}/v1/users/alice/memories", params={"offset": 10_000}).json()["units"] == []
    for params, name in (({"limit": "x"}, "limit"), ({"limit": 0}, "limit"), ({"offset": -1}, "offset"),
                         ({"page": 2}, "page")):
        bad = httpx.get(f"{url}/v1/users/alice/memories", params=params)
        assert bad.status_code == 400 and f"'{name}'" in bad.json()["error"]["message"], (params, bad.text)

    database = tmp_path / "memories" / "memories.db"

    def rows(user_id: str) -> dict[str, int]:
        with sqlite3.connect(database) as conn:
            return {t: conn.execute(f"SELECT COUNT(*) FROM {t} WHERE user_id = ?", (user_id,)).fetchone()[0]
                    for t in ("users", "changes", "snapshots")}

    assert rows("alice") == {"users": 1, "changes": 2, "snapshots": 1}
    r = httpx.delete(f"{url}/v1/users/alice")
    assert r.status_code == 200 and r.json() == {"user": "alice", "deleted": True}
    assert rows("alice") == {"users": 0, "changes": 0, "snapshots": 0}
    assert rows("bob") == {"users": 1, "changes": 1, "snapshots": 1}  # control: the other user's rows are kept
    assert httpx.post(f"{url}/v1/users/alice/answer", json={"question": "Where do I live?"}).status_code == 404
    assert httpx.delete(f"{url}/v1/users/alice").status_code == 404
    again = httpx.post(f"{url}/v1/users/alice/sessions", json={"turns": MORE}).json()  # a new, empty memory
    assert again["session"] == 0 and again["units"] == again["units_added"]


# --------------------------------------------------------------------------------------- OpenAI surface
def test_models_in_the_openai_shape(server):
    url, service = server
    listed = httpx.get(f"{url}/v1/models").json()
    assert listed["object"] == "list" and listed["data"][0] == {"id": "qgmem", "object": "model",
                                                               "created": service.started, "owned_by": "qgmem"}
    assert httpx.get(f"{url}/v1/models/qgmem").json()["id"] == "qgmem"
    missing = httpx.get(f"{url}/v1/models/gpt-5")
    assert missing.status_code == 404 and "gpt-5" in missing.json()["error"]["message"]
    openai = pytest.importorskip("openai")
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
    assert "qgmem" in [m.id for m in client.models.list()]


CHAT = {"user": "alice", "messages": [{"role": "user", "content": "Where do I live?"}]}


@pytest.mark.parametrize("extra,field", [
    ({"n": 2}, "n"), ({"tools": [{"type": "function", "function": {"name": "f"}}]}, "tools"),
    ({"response_format": {"type": "json_object"}}, "response_format"), ({"logprobs": True}, "logprobs"),
    ({"stop": ["\n"]}, "stop"), ({"stream": "no"}, "stream"), ({"graph_mode": "best"}, "graph_mode"),
    ({"graph": "best"}, "graph"),  # the graph mode's older name, read and checked as graph_mode
    ({"max_tokens": 0}, "max_tokens"), ({"max_completion_tokens": True}, "max_completion_tokens"),
    ({"time": "yesterday"}, "time"),
])
def test_unsupported_or_mistyped_chat_fields_are_refused_by_name(server, extra, field):
    url, _ = server
    r = httpx.post(f"{url}/v1/chat/completions", json={**CHAT, **extra})
    assert r.status_code == 400 and f"'{field}'" in r.json()["error"]["message"], r.text


def test_neutral_values_of_openai_fields_are_accepted(server):
    """The control of the test above: what OpenAI clients send by default is served."""
    url, _ = server
    r = httpx.post(f"{url}/v1/chat/completions", json={**CHAT, "n": 1, "logprobs": False, "stop": None, "tools": [],
                                                     "response_format": {"type": "text"}, "stream": False,
                                                     "temperature": 0.7, "top_p": 1, "seed": 3, "graph_mode": "none",
                                                     "time": "2024-06-01T09:00:00Z"})
    assert r.status_code == 200, r.text


@pytest.mark.parametrize("path,body,needle", [
    ("/v1/users/alice/answer", {"question": "Where?", "graph_modes": "none"}, "unknown field 'graph_modes'"),
    ("/v1/users/alice/answer", {"question": "Where?", "time": "2024-13-45"}, "field 'time'"),
    ("/v1/users/alice/sessions", {"turns": ALICE, "time": "yesterday"}, "field 'time'"),
    ("/v1/users/alice/sessions", {"turns": [{"speaker": "U", "text": "hi", "time": "2024-13-45"}]},
     "turns[0]: field 'time'"),
    ("/v1/users/alice/sessions", {"turns": [{"speaker": "U", "text": "hi", "when": "2024-05-01"}]},
     "turns[0]: unknown field 'when'"),
    ("/v1/users/alice/sessions", {"turns": ALICE, "session": 3}, "unknown field 'session'"),
])
def test_unknown_fields_and_unreadable_times_are_400_naming_the_field(server, path, body, needle):
    url, _ = server
    r = httpx.post(url + path, json=body)
    assert r.status_code == 400 and needle in r.json()["error"]["message"], r.text


# -------------------------------------------------------------------------------------- idempotency
def test_six_identical_appends_with_one_key_store_one_copy_and_return_the_first_result(server, pipeline, tmp_path):  # noqa: F811
    url, service = server
    before = httpx.get(f"{url}/v1/users/alice/memories").json()["total"]
    headers = {"Idempotency-Key": "append-42"}
    with ThreadPoolExecutor(6) as pool:
        replies = list(pool.map(lambda _: httpx.post(f"{url}/v1/users/alice/sessions", json={"turns": BOB},
                                                     headers=headers, timeout=60), range(6)))
    assert all(r.status_code == 200 for r in replies)
    bodies = [r.json() for r in replies]
    first = next(b for b in bodies if not b.get("replayed"))
    assert sum(not b.get("replayed") for b in bodies) == 1
    stored = {k: v for k, v in first.items() if k != "seconds"}  # a replay: the result, not the first request's times
    assert all({k: v for k, v in b.items() if k != "replayed"} == stored for b in bodies if b.get("replayed"))
    assert len(service.users.store.changes("alice", 0)) == 3 and first["session"] == 2
    assert httpx.get(f"{url}/v1/users/alice/memories").json()["total"] == before + first["units_added"]
    conflict = httpx.post(f"{url}/v1/users/alice/sessions", json={"turns": MORE}, headers=headers)
    assert conflict.status_code == 409 and "append-42" in conflict.json()["error"]["message"]
    other = httpx.post(f"{url}/v1/users/alice/sessions", json={"turns": BOB}, headers={"Idempotency-Key": "k2"})
    assert other.json()["session"] == 3  # control: another key stores the session again
    bad = httpx.post(f"{url}/v1/users/alice/sessions", json={"turns": BOB}, headers={"Idempotency-Key": "a b"})
    assert bad.status_code == 400 and "Idempotency-Key" in bad.json()["error"]["message"]
    restarted = _service(pipeline, tmp_path)  # the keys live in the store: a restart still knows them
    again = restarted.users.append("alice", BOB, None, "append-42")
    assert again["replayed"] and again["session"] == 2 and again["units"] == first["units"]


# ------------------------------------------------------------------------------------ resources
def test_a_stalled_body_gets_408_within_the_deadline(pipeline, tmp_path):  # noqa: F811
    service = _service(pipeline, tmp_path, limits=Limits(body_timeout_s=0.5))
    with running(create_app(service)) as url:
        port = int(url.rsplit(":", 1)[1])
        with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
            s.sendall(b"POST /v1/users/alice/sessions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                      b"Content-Length: 100\r\n\r\n{\"turns\"")
            started = time.monotonic()
            reply = b""
            while chunk := s.recv(4096):
                reply += chunk
            waited = time.monotonic() - started
        assert reply.startswith(b"HTTP/1.1 408") and b"not received within 0.5 s" in reply, reply[:300]
        assert 0.4 < waited < 5  # and the connection was closed
        assert httpx.post(f"{url}/v1/users/alice/sessions", json={"turns": ALICE}).status_code == 200  # control


def test_users_beyond_the_budget_are_unloaded_and_reloaded_the_same(pipeline, tmp_path):  # noqa: F811
    service = _service(pipeline, tmp_path, max_loaded_users=1)
    with running(create_app(service)) as url:
        httpx.post(f"{url}/v1/users/alice/sessions", json={"turns": ALICE}).raise_for_status()
        ask = {"question": "Where do I live?"}
        first = httpx.post(f"{url}/v1/users/alice/search", json=ask).json()
        assert service.users.loaded() == 1 and service.users.unloaded == 0  # control: within the budget
        httpx.post(f"{url}/v1/users/bob/sessions", json={"turns": BOB}).raise_for_status()
        assert service.users.loaded() == 1 and service.users.unloaded == 1  # alice: least recently used
        again = httpx.post(f"{url}/v1/users/alice/search", json=ask).json()
        assert again["units"] == first["units"] and again["memory_text"] == first["memory_text"]
        assert httpx.post(f"{url}/v1/users/alice/sessions", json={"turns": MORE}).json()["session"] == 1


def test_idle_users_are_unloaded_by_the_sweep_and_reloaded_the_same(pipeline, tmp_path):  # noqa: F811
    service = _service(pipeline, tmp_path, idle_unload_s=0.2)
    assert service.users.unload_idle() == 0
    with running(create_app(service)) as url:
        httpx.post(f"{url}/v1/users/alice/sessions", json={"turns": ALICE}).raise_for_status()
        ask = {"question": "Where do I live?"}
        first = httpx.post(f"{url}/v1/users/alice/search", json=ask).json()
        deadline = time.monotonic() + 10
        while service.users.loaded() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert service.users.loaded() == 0 and service.users.unloaded >= 1  # the sweep, not a request
        assert httpx.post(f"{url}/v1/users/alice/search", json=ask).json()["units"] == first["units"]
        assert httpx.post(f"{url}/v1/users/alice/sessions", json={"turns": MORE}).json()["session"] == 1


def test_one_snapshot_row_per_user_is_kept_at_the_last_change(server, tmp_path):
    url, service = server
    for _ in range(3):
        httpx.post(f"{url}/v1/users/alice/sessions", json={"turns": MORE}).raise_for_status()
    with sqlite3.connect(tmp_path / "memories" / "memories.db") as conn:
        assert conn.execute("SELECT user_id, seq FROM snapshots").fetchall() == [("alice", 5)]


def test_the_access_log_never_holds_a_query_string(pipeline, tmp_path):  # noqa: F811
    import uvicorn

    records: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record):
            records.append(record.getMessage())

    app = create_app(_service(pipeline, tmp_path))
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="info"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.02)
    handler = Keep()
    logging.getLogger("uvicorn.access").addHandler(handler)
    try:
        httpx.get(f"http://127.0.0.1:{port}/healthz?api_key=SECRET-123&x=1")
        httpx.get(f"http://127.0.0.1:{port}/v1/models?token=SECRET-456")
    finally:
        logging.getLogger("uvicorn.access").removeHandler(handler)
        server.should_exit = True
        thread.join(timeout=30)
    assert any("/healthz" in r for r in records) and any("/v1/models" in r for r in records), records
    assert not any("SECRET" in r or "?" in r for r in records), records


def test_the_bearer_scheme_is_case_insensitive(pipeline, tmp_path):  # noqa: F811
    with running(create_app(_service(pipeline, tmp_path), api_key="s3cret")) as url:
        def status(header):
            return httpx.get(f"{url}/v1/models", headers={"Authorization": header}).status_code

        assert [status(h) for h in ("Bearer s3cret", "bearer s3cret", "BEARER  s3cret")] == [200, 200, 200]
        assert [status(h) for h in ("Basic s3cret", "bearer s3cre", "bearers3cret", "s3cret")] == [401] * 4
