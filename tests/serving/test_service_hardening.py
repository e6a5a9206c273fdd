"""The service's defects of the fourth probe, each shown where it was found: metric labels any client
could add, an idempotency key lost with a failed snapshot, paging numbers that became a 500, a user
folder without its journal (and the delete that could leave one); and the OpenAI extras and methods
clients send by default."""

from __future__ import annotations

import random
import string

import httpx
import pytest

pytest.importorskip("fastapi")

from qgmem.errors import IntegrityError
from qgmem.serving import users as users_module
from qgmem.serving.server import create_app
from qgmem.serving.users import JOURNAL, UnknownUser, UserMemories, read_journal

from .server_helpers import running
from .test_server import ALICE, BOB, _service, pipeline  # noqa: F401  (fixture)
from .test_users import TURNS, _Models

KEY = {"Authorization": "Bearer k3y"}


def _random_path(rng: random.Random) -> str:
    return "/v1/users/x/" + "".join(rng.choice(string.ascii_letters) for _ in range(300))


# ------------------------------------------------------------------------------------------- metrics
def test_metric_labels_are_route_templates_and_a_refused_request_adds_no_series(pipeline, tmp_path):  # noqa: F811
    """Was: every 4-segment path its own label (``/v1/users/{user_id}/<last segment>``), counted before
    the key check, so 404s and 401s grew /metrics without bound."""
    rng = random.Random(0)
    with running(create_app(_service(pipeline, tmp_path), api_key="k3y")) as url:
        httpx.post(f"{url}/v1/users/alice/sessions", json={"turns": ALICE}, headers=KEY).raise_for_status()
        before = httpx.get(f"{url}/metrics", headers=KEY).text
        for _ in range(20):
            assert httpx.get(url + _random_path(rng), headers=KEY).status_code == 404
            assert httpx.delete(url + _random_path(rng)[:-150], headers=KEY).status_code == 404
            assert httpx.get(url + _random_path(rng)).status_code == 401  # no key
            assert httpx.post(f"{url}/v1/users/alice/sessions", json={"turns": ALICE}).status_code == 401
        after = httpx.get(f"{url}/metrics", headers=KEY).text
    series = [line for line in after.splitlines() if line.startswith("qgmem_requests_total{")]
    assert 'qgmem_requests_total{endpoint="unmatched",status="404"} 40.0' in series, series
    assert 'qgmem_requests_total{endpoint="/v1/users/{user_id}/sessions",status="200"} 1.0' in series
    assert not any('status="401"' in line for line in series)
    assert "qgmem_unauthorized_requests_total 40.0" in after
    assert len(series) == 3, series  # sessions 200, metrics 200, unmatched 404: nothing per path
    assert len(after) < len(before) + 6000


# ---------------------------------------------------------------------------------------- idempotency
def test_a_retry_after_a_failed_snapshot_returns_the_stored_session(pipeline, tmp_path, monkeypatch):  # noqa: F811
    """Was: the key counted only once the snapshot was written, so each retry after the 500 stored the
    session again (four copies of every fact after four tries)."""
    service = _service(pipeline, tmp_path)

    def disk_full(user):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(service.users, "_snapshot", disk_full)
    with running(create_app(service)) as url:
        headers = {"Idempotency-Key": "k-1"}
        send = lambda: httpx.post(f"{url}/v1/users/alice/sessions", json={"turns": ALICE}, headers=headers)  # noqa: E731
        assert send().status_code == 500
        retries = [send() for _ in range(3)]
        assert [r.status_code for r in retries] == [200] * 3
        assert all(r.json()["replayed"] and r.json()["session"] == 0 for r in retries)
        other = httpx.post(f"{url}/v1/users/alice/sessions", json={"turns": BOB}, headers={"Idempotency-Key": "k-2"})
        assert other.status_code == 500  # control: a new key stores its session (the snapshot still fails)
    lines = read_journal(tmp_path / "memories" / "users" / "alice" / JOURNAL)
    assert [e["key"] for e in lines] == ["k-1", "k-2"]
    restarted = _service(pipeline, tmp_path)
    memory = restarted.memories("alice", 0, 1000)
    facts = [u["fact"] for u in memory["units"]]
    assert memory["sessions"] == 2 and len(facts) > retries[0].json()["units"]
    assert len(facts) == len(set(facts))  # one copy of each fact


# -------------------------------------------------------------------------------------------- paging
@pytest.fixture
def alice(pipeline, tmp_path):  # noqa: F811
    service = _service(pipeline, tmp_path)
    with running(create_app(service)) as url:
        httpx.post(f"{url}/v1/users/alice/sessions", json={"turns": ALICE}).raise_for_status()
        yield url


@pytest.mark.parametrize("query,name", [
    ("offset=%C2%B2", "offset"),  # a superscript two: was a 500
    ("limit=" + "9" * 5000, "limit"),  # was a 500
    ("offset=%D9%A3", "offset"),  # an Arabic-Indic three: was accepted
    ("limit=%EF%BC%95", "limit"),  # a full-width five: was accepted
    ("limit=1e2", "limit"), ("limit=+5", "limit"), ("limit=%205", "limit"), ("offset=-0", "offset"),
    ("offset=1000000001", "offset"), ("limit=1001", "limit"),
    ("limit=5&limit=6", "limit"),  # a repeated parameter: was the last one silently
])
def test_paging_numbers_are_ascii_digits_within_a_bound(alice, query, name):
    r = httpx.get(f"{alice}/v1/users/alice/memories?{query}")
    assert r.status_code == 400, r.text
    assert f"query parameter '{name}'" in r.json()["error"]["message"]


def test_paging_numbers_in_range_are_served(alice):
    """The control of the test above."""
    r = httpx.get(f"{alice}/v1/users/alice/memories?offset=0000001&limit=1000")
    assert r.status_code == 200 and r.json()["offset"] == 1 and r.json()["limit"] == 1000


# ------------------------------------------------------------------------------ a folder without journal
def test_a_snapshot_without_its_journal_is_refused_from_the_first_request(tmp_path):
    """Was: the user read as unknown, the next append was accepted as session 0, and after a restart
    every request was a 500 (the new session unreachable too)."""
    users = UserMemories(tmp_path, _Models())
    for turns in TURNS[:2]:
        users.append("ana", turns)
    folder = tmp_path / "users" / "ana"
    (folder / JOURNAL).unlink()
    reloaded = UserMemories(tmp_path, _Models())
    assert reloaded.exists("ana") and reloaded.user_ids() == ["ana"]
    with pytest.raises(IntegrityError, match="journal.jsonl is missing"):
        reloaded.get("ana")
    with pytest.raises(IntegrityError, match="journal.jsonl is missing"):
        reloaded.append("ana", TURNS[2])
    assert sorted(p.name for p in folder.iterdir()) == ["snapshot-00000002"]  # nothing written, nothing removed


def test_a_snapshot_without_its_journal_is_a_500_naming_it_over_http(pipeline, tmp_path):  # noqa: F811
    service = _service(pipeline, tmp_path)
    service.users.append("alice", ALICE)
    (tmp_path / "memories" / "users" / "alice" / JOURNAL).unlink()
    with running(create_app(_service(pipeline, tmp_path))) as url:
        first = httpx.get(f"{url}/v1/users/alice/memories")
        append = httpx.post(f"{url}/v1/users/alice/sessions", json={"turns": ALICE})
    for r in (first, append):
        assert r.status_code == 500 and "users/alice/journal.jsonl is missing" in r.json()["error"]["message"], r.text


def test_a_delete_killed_midway_leaves_the_whole_user_or_nothing(tmp_path, monkeypatch):
    """Was: ``rmtree`` in place, so a kill after the journal went left its snapshot behind (the state of
    the test above). The folder is renamed out of users/ first; the rest goes at the next start."""
    users = UserMemories(tmp_path, _Models())
    for turns in TURNS[:2]:
        users.append("ana", turns)
    users.append("bob", TURNS[3])

    def killed(path, *args, **kwargs):  # removes the journal, then the process dies
        (path / JOURNAL).unlink()
        raise SystemExit("killed")

    monkeypatch.setattr(users_module.shutil, "rmtree", killed)
    with pytest.raises(SystemExit):
        users.delete("ana")
    monkeypatch.undo()
    assert not (tmp_path / "users" / "ana").exists()
    restarted = UserMemories(tmp_path, _Models())
    assert not (tmp_path / "deleted").exists()  # the leftover went at the start
    with pytest.raises(UnknownUser):
        restarted.get("ana")
    assert restarted.append("ana", TURNS[2])["session"] == 0  # a new user, served after a restart too
    again = UserMemories(tmp_path, _Models())
    assert len(again.get("ana").store) == 1 and len(again.get("bob").store) == 1


# ------------------------------------------------------------------------------------ OpenAI extras
CHAT = {"user": "alice", "messages": [{"role": "user", "content": "Where do I live?"}]}


def test_newer_openai_fields_that_do_not_change_the_answer_are_accepted(alice):
    """Was: a 400 for each (official clients may send them by default)."""
    extras = {"prompt_cache_key": "conv-7", "safety_identifier": "hash-of-user", "metadata": {"run": "1"},
              "store": False, "verbosity": "medium"}
    plain = httpx.post(f"{alice}/v1/chat/completions", json=CHAT, timeout=60).json()
    r = httpx.post(f"{alice}/v1/chat/completions", json={**CHAT, **extras}, timeout=60)
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["message"]["content"] == plain["choices"][0]["message"]["content"]
    for extra, name in (({"verbosity": "low"}, "verbosity"), ({"prompt_cache_key": 3}, "prompt_cache_key"),
                        ({"metadata": "x"}, "metadata")):
        bad = httpx.post(f"{alice}/v1/chat/completions", json={**CHAT, **extra})
        assert bad.status_code == 400 and f"'{name}'" in bad.json()["error"]["message"], bad.text


def test_head_and_options_on_models(alice):
    """Was: 405 for both (proxies' health checks send HEAD, clients OPTIONS)."""
    get, head = httpx.get(f"{alice}/v1/models"), httpx.head(f"{alice}/v1/models")
    assert head.status_code == 200 and head.content == b""
    assert head.headers["content-type"] == get.headers["content-type"] == "application/json"
    options = httpx.options(f"{alice}/v1/models")
    assert options.status_code == 204 and options.headers["allow"] == "GET, HEAD, OPTIONS"
