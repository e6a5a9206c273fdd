"""What agents ask of the memory service, over HTTP: forget one memory, time and session filters applied
before the top k, export and import, batch appends; each with the key, bounded bodies and 4xx naming
the field. (Their kill tests, through the Python API: tests/serving/test_users_changes.py.)"""

from __future__ import annotations

import json

import httpx
import pytest

pytest.importorskip("fastapi")

from qgmem.serving.requests import Limits
from qgmem.serving.server import create_app

from .server_helpers import running
from .test_server import ALICE, BOB, _service, pipeline  # noqa: F401  (fixture)

MORE = [{"speaker": "User", "text": "I moved to Porto in March and my dog Biscuit loves the beach."}]
RED = [{"speaker": "User", "text": "My favourite colour is red now."}]
SESSIONS = [(ALICE, "2024-01-10"), (MORE, "2024-03-05"), (RED, "2024-06-01T09:00:00")]


@pytest.fixture
def alice(pipeline, tmp_path):  # noqa: F811
    service = _service(pipeline, tmp_path, limits=Limits(max_body_bytes=20_000, max_import_bytes=60_000))
    with running(create_app(service)) as url:
        for turns, when in SESSIONS:
            httpx.post(f"{url}/v1/users/alice/sessions", json={"turns": turns, "time": when}).raise_for_status()
        yield url, service


def _units(url: str, user: str = "alice", **params) -> list[dict]:
    r = httpx.get(f"{url}/v1/users/{user}/memories", params={"limit": 1000, **params})
    assert r.status_code == 200, r.text
    return r.json()["units"]


# ------------------------------------------------------------------------------------------ forget
def test_a_forgotten_memory_is_never_returned_again(alice, pipeline, tmp_path):  # noqa: F811
    url, _ = alice
    lisbon = next(u for u in _units(url) if "Lisbon" in u["fact"])
    ask = {"question": "Where do I live?"}
    before = httpx.post(f"{url}/v1/users/alice/search", json=ask).json()
    assert "lisbon" in json.dumps(before).lower()  # control: found before the forget
    r = httpx.delete(f"{url}/v1/users/alice/memories/{lisbon['unit_id']}")
    assert r.status_code == 200 and r.json()["forgotten"] and r.json()["unit_id"] == lisbon["unit_id"], r.text
    search = httpx.post(f"{url}/v1/users/alice/search", json=ask).json()
    answer = httpx.post(f"{url}/v1/users/alice/answer", json=ask, timeout=60).json()
    for reply in (search, answer, {"units": _units(url)}):
        assert "lisbon" not in json.dumps(reply).lower() and lisbon["unit_id"] not in json.dumps(reply)
    again = httpx.delete(f"{url}/v1/users/alice/memories/{lisbon['unit_id']}")
    assert again.status_code == 404 and "forgotten already" in again.json()["error"]["message"]
    bad = httpx.delete(f"{url}/v1/users/alice/memories/a%20b")
    assert bad.status_code == 400 and "unit id" in bad.json()["error"]["message"]
    assert httpx.delete(f"{url}/v1/users/nobody/memories/w0000.u0").status_code == 404
    restarted = _service(pipeline, tmp_path)  # the forget is stored: a restart does not bring it back
    assert "lisbon" not in json.dumps(restarted.memories("alice", 0, 1000)).lower()


def test_after_a_forget_and_an_append_the_search_is_that_of_a_fresh_load(alice, pipeline, tmp_path):  # noqa: F811
    """The activator built before the forget must not be extended with the appended rows: its indexes
    still hold the forgotten unit's row, so every row after it would name the wrong unit."""
    url, _ = alice
    ask = {"question": "Where do I live?"}
    httpx.post(f"{url}/v1/users/alice/search", json=ask).raise_for_status()  # an activator over the full store
    units = _units(url)
    httpx.delete(f"{url}/v1/users/alice/memories/{units[0]['unit_id']}").raise_for_status()
    httpx.post(f"{url}/v1/users/alice/sessions", json={"turns": BOB[2:]}).raise_for_status()
    assert len(_units(url)) >= len(units)  # as many rows as the activator's indexes hold
    live = httpx.post(f"{url}/v1/users/alice/search", json=ask).json()
    fresh = _service(pipeline, tmp_path).search("alice", ask["question"], None)
    assert [(u["unit_id"], u["score"]) for u in live["units"]] == [(u["unit_id"], u["score"]) for u in fresh["units"]]


# ----------------------------------------------------------------------------------------- filters
def test_filters_pick_the_units_before_the_top_k(alice):
    url, _ = alice
    units = _units(url)
    by_session = {s: [u["unit_id"] for u in units if u["session_id"] == s] for s in ("s0", "s1", "s2")}
    assert all(by_session.values())
    colour = {"question": "What is my favourite colour?", "limit": 1}
    top = httpx.post(f"{url}/v1/users/alice/search", json=colour).json()["units"][0]
    assert top["session_id"] != "s1"  # control: the global top is a colour unit, not Porto's session
    only = httpx.post(f"{url}/v1/users/alice/search", json={**colour, "sessions": ["s1"]}).json()
    assert [u["session_id"] for u in only["units"]] == ["s1"]  # the best s1 unit, not "none of the top 1"
    assert only["matching_units"] == len(by_session["s1"]) and only["store_units"] == len(units)
    later = httpx.post(f"{url}/v1/users/alice/search", json={"question": "What is my favourite colour?",
                                                             "after": "2024-03-01"}).json()
    assert later["units"] and {u["session_id"] for u in later["units"]} <= {"s1", "s2"}
    window = _units(url, after="2024-03-01", before="2024-05-01T00:00:00")
    assert [u["unit_id"] for u in window] == by_session["s1"]
    assert [u["unit_id"] for u in _units(url, sessions="s0,s2")] == by_session["s0"] + by_session["s2"]
    assert _units(url, before="2024-01-10T00:00:00") == [] and _units(url, time_field="fact") == units
    assert _units(url, after="2020-01-01", time_field="fact") == [u for u in units if u["fact_time"]]


@pytest.mark.parametrize("body,name", [
    ({"after": "yesterday"}, "field 'after'"), ({"before": 5}, "field 'before'"),
    ({"time_field": "when"}, "field 'time_field'"), ({"after": "2024-05-01", "before": "2024-01-01"}, "'before'"),
    ({"sessions": []}, "field 'sessions'"), ({"sessions": "s0"}, "field 'sessions'"),
])
def test_bad_search_filters_are_400_naming_the_field(alice, body, name):
    url, _ = alice
    r = httpx.post(f"{url}/v1/users/alice/search", json={"question": "Where do I live?", **body})
    assert r.status_code == 400 and name in r.json()["error"]["message"], r.text


def test_bad_memories_filters_are_400_naming_the_parameter(alice):
    url, _ = alice
    for params, name in (({"after": "2024-13-01"}, "after"), ({"time_field": "x"}, "time_field"),
                         ({"sessions": ""}, "sessions")):
        r = httpx.get(f"{url}/v1/users/alice/memories", params=params)
        assert r.status_code == 400 and f"query parameter '{name}'" in r.json()["error"]["message"], r.text


# ------------------------------------------------------------------------------------ export, import
def test_an_export_imported_as_a_new_user_gives_the_same_units_and_search_results(alice):
    url, _ = alice
    httpx.delete(f"{url}/v1/users/alice/memories/{_units(url)[1]['unit_id']}").raise_for_status()
    with httpx.stream("GET", f"{url}/v1/users/alice/export") as r:
        assert r.status_code == 200 and r.headers["content-type"] == "application/json"
        text = "".join(r.iter_text())
    document = json.loads(text)
    assert (document["format"], document["version"], document["user"]) == ("qgmem-user-export", 1, "alice")
    assert [sorted(e) for e in document["entries"]] == [["time", "turns"]] * 3 + [["forget"]]
    r = httpx.post(f"{url}/v1/users/copy/import", content=text, headers={"content-type": "application/json"})
    assert r.status_code == 200 and r.json()["units"] == len(_units(url)), r.text
    assert _units(url, "copy") == _units(url)
    for question in ("Where do I live?", "What is my favourite colour?"):
        a, b = (httpx.post(f"{url}/v1/users/{user}/search", json={"question": question}).json()
                for user in ("alice", "copy"))
        assert a["units"] == b["units"] and a["memory_text"] == b["memory_text"] and a["graph"] == b["graph"]
    again = httpx.post(f"{url}/v1/users/copy/import", content=text, headers={"content-type": "application/json"})
    assert again.status_code == 409 and "exists" in again.json()["error"]["message"]
    assert httpx.get(f"{url}/v1/users/nobody/export").status_code == 404
    long = [{"turns": [{"speaker": "User", "text": f"Note {n}: " + "the garden shed is blue. " * 280}]} for n in range(4)]
    big = {"format": "qgmem-user-export", "version": 1, "entries": long}
    assert 20_000 < len(json.dumps(big)) < 60_000  # over the body limit of the other endpoints, within the import's
    assert httpx.post(f"{url}/v1/users/big/import", json=big).status_code == 200
    assert httpx.post(f"{url}/v1/users/big/sessions/batch", json={"sessions": long}).status_code == 413


@pytest.mark.parametrize("document,status,needle", [
    ({"format": "other", "version": 1, "entries": []}, 400, "'format'"),
    ({"format": "qgmem-user-export", "version": 1, "entries": [{"turns": ALICE}, {"turns": []}]}, 400,
     "entries[1]: field 'turns'"),
    ({"format": "qgmem-user-export", "version": 1, "entries": [{"forget": "w0009.u9"}]}, 400,
     "entries[0]: field 'forget'"),
    ({"format": "qgmem-user-export", "version": 1, "entries": [{"forget": "a/b"}]}, 400, "entries[0]: field 'forget'"),
    ({"format": "qgmem-user-export", "version": 1, "entries": [], "extra": 1}, 400, "unknown field 'extra'"),
    ({"format": "qgmem-user-export", "version": True, "entries": []}, 400, "'version'"),  # was: taken as 1
    ({"format": "qgmem-user-export", "version": 1.0, "entries": []}, 400, "'version'"),
    ({"format": "qgmem-user-export", "version": 1, "user": ["x"], "entries": []}, 400, "field 'user'"),
    ({"format": "qgmem-user-export", "version": 1, "entries": [{"turns": ALICE, "time": "x" * 70_000}]}, 413,
     "over the limit of 60000"),
])
def test_bad_imports_are_4xx_naming_the_field_and_store_nothing(alice, document, status, needle):
    url, service = alice
    r = httpx.post(f"{url}/v1/users/newcomer/import", json=document)
    assert r.status_code == status and needle in r.json()["error"]["message"], r.text
    assert not service.users.exists("newcomer")


# ------------------------------------------------------------------------------------------- batch
def test_a_batch_append_is_acknowledged_once_and_idempotent_as_a_whole(alice, tmp_path):
    url, service = alice
    batch = {"sessions": [{"turns": BOB, "time": "2024-07-01"}, {"turns": MORE}]}
    key = {"Idempotency-Key": "batch-1"}
    first = httpx.post(f"{url}/v1/users/bob/sessions/batch", json=batch, headers=key)
    assert first.status_code == 200, first.text
    body = first.json()
    assert [s["session"] for s in body["sessions"]] == [0, 1] and body["units"] == len(_units(url, "bob"))
    replay = httpx.post(f"{url}/v1/users/bob/sessions/batch", json=batch, headers=key).json()
    assert replay["replayed"] and replay["sessions"] == body["sessions"]
    conflict = httpx.post(f"{url}/v1/users/bob/sessions/batch", json={"sessions": batch["sessions"][:1]}, headers=key)
    assert conflict.status_code == 409
    assert len(service.users.store.changes("bob", 0)) == 2  # one change per session, stored once
    for bad, status, needle in (({"sessions": []}, 400, "field 'sessions'"),
                                ({"sessions": [{"turns": BOB}, {"turns": [{"speaker": "U"}]}]}, 400,
                                 "sessions[1]: turns[0]: field 'text'"),
                                ({"sessions": [{"turns": BOB}], "key": 1}, 400, "unknown field 'key'"),
                                ({"sessions": [{"turns": MORE}] * 101}, 413, "101 sessions")):
        r = httpx.post(f"{url}/v1/users/bob/sessions/batch", json=bad)
        assert r.status_code == status and needle in r.json()["error"]["message"], (bad, r.text)
    assert len(service.users.store.changes("bob", 0)) == 2


# -------------------------------------------------------------------------------------------- auth
def test_the_new_endpoints_need_the_key(pipeline, tmp_path):  # noqa: F811
    auth = {"Authorization": "Bearer k3y"}
    with running(create_app(_service(pipeline, tmp_path), api_key="k3y")) as url:
        calls = [("DELETE", "/v1/users/alice/memories/w0000.u0", None), ("GET", "/v1/users/alice/export", None),
                 ("POST", "/v1/users/alice/import", {"format": "qgmem-user-export", "version": 1, "entries": []}),
                 ("POST", "/v1/users/alice/sessions/batch", {"sessions": [{"turns": ALICE}]})]
        refused = [httpx.request(m, url + p, json=b).status_code for m, p, b in calls]
        served = [httpx.request(m, url + p, json=b, headers=auth).status_code for m, p, b in calls]
    assert refused == [401] * 4 and served == [404, 404, 200, 200]
