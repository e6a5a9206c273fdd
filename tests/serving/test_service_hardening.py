"""The service's defects of the fourth probe, each shown where it was found: metric labels any client
could add, an idempotency key lost with a failed snapshot (now: a write and its snapshot are one
transaction), paging numbers that became a 500; and the OpenAI extras and methods clients send by default."""

from __future__ import annotations

import random
import sqlite3
import string

import httpx
import pytest

pytest.importorskip("fastapi")

from qgmem.serving.server import create_app
from qgmem.serving.storage.base import SqlStore

from .server_helpers import running
from .test_server import ALICE, BOB, _service, pipeline  # noqa: F401  (fixture)

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
def test_a_write_whose_snapshot_fails_stores_nothing_and_its_retry_stores_it_once(pipeline, tmp_path, monkeypatch):  # noqa: F811
    """Was: the change made durable before its snapshot, so a failed snapshot gave a 500 for an append (or
    a forget) that was stored, and the forget's retry a 404. The snapshot is in the change's transaction:
    a failure is a clear 5xx with nothing stored, and the retry stores the change once."""
    service = _service(pipeline, tmp_path)
    real = SqlStore._upsert_snapshot

    def disk_full(*args):
        raise sqlite3.OperationalError("database or disk is full")

    monkeypatch.setattr(SqlStore, "_upsert_snapshot", disk_full)
    with running(create_app(service)) as url:
        headers = {"Idempotency-Key": "k-1"}
        send = lambda: httpx.post(f"{url}/v1/users/alice/sessions", json={"turns": ALICE}, headers=headers)  # noqa: E731
        failed = send()
        assert failed.status_code == 507 and "nothing of this request was stored" in failed.json()["error"]["message"]
        assert service.users.user_ids() == []
        monkeypatch.setattr(SqlStore, "_upsert_snapshot", real)
        first, again = send(), send()
        assert first.status_code == 200 and not first.json().get("replayed") and again.json()["replayed"]
        unit = httpx.get(f"{url}/v1/users/alice/memories").json()["units"][0]["unit_id"]
        monkeypatch.setattr(SqlStore, "_upsert_snapshot", disk_full)
        assert httpx.delete(f"{url}/v1/users/alice/memories/{unit}").status_code == 507
        monkeypatch.setattr(SqlStore, "_upsert_snapshot", real)
        assert httpx.delete(f"{url}/v1/users/alice/memories/{unit}").status_code == 200  # the forget was not stored
        assert httpx.delete(f"{url}/v1/users/alice/memories/{unit}").status_code == 404
    restarted = _service(pipeline, tmp_path)
    memory = restarted.memories("alice", 0, 1000)
    facts = [u["fact"] for u in memory["units"]]
    assert memory["sessions"] == 1 and len(facts) == len(set(facts)) == first.json()["units"] - 1
    assert unit not in {u["unit_id"] for u in memory["units"]}


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
