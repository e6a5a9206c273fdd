"""The store contract: what ``UserMemories`` keeps in a store, run against every backend (a SQLite file
and a real PostgreSQL): reload, snapshots and their checks, idempotency keys held by the database, the
schema's migrations, and replicas over one store."""

from __future__ import annotations

import json
import sqlite3

import pytest

from qgmem.activation.memory import Memory
from qgmem.memory.builder import MemoryBuilder
from qgmem.memory.config import ConstructionConfig
from qgmem.serving.storage import open_store
from qgmem.serving.storage.base import MIGRATIONS, SCHEMA_VERSION, NewerSchema, encode_snapshot
from qgmem.serving.users import BadUserId, IdempotencyConflict, UnknownUser, UserMemories, check_user_id

from .helpers import HashEncoder


class _Models:
    """What UserMemories needs of a pipeline: a builder, and memories built or opened with it."""

    def __init__(self):
        self._builder = MemoryBuilder(ConstructionConfig(extractor="heuristic"), HashEncoder(8))

    def builder(self):
        return self._builder

    def build_memory(self, dialogue):
        return Memory.build(self._builder, dialogue)

    def open_memory(self, store):
        return Memory(store, self._builder.encoder)


TURNS = [[{"speaker": "User", "text": f"I planted {n} tulips and {n + 1} roses in the garden."}] for n in range(4)]


def state(url: str, user_id: str) -> tuple | None:
    """The user's memory as a fresh process loads it: (unit id, fact, trace id) per unit, the traces and
    the embeddings."""
    users = UserMemories(url, _Models())
    try:
        if not users.exists(user_id):
            return None
        store = users.get(user_id).store
        return ([(u.id, u.fact, u.trace_id) for u in store.units],
                [(t.unit_ids, t.transitions, t.latest_unit_id) for t in store.traces], store.embeddings.tolist())
    finally:
        users.store.close()


def _facts(users: UserMemories, user_id: str) -> list[str]:
    return [u.fact for u in users.get(user_id).store.units]


def _sql(url: str, statement: str, params: tuple = ()) -> list:
    """One statement on the store's database, outside qgmem (what an operator or a damaged disk does)."""
    if url.startswith("sqlite:"):
        with sqlite3.connect(url[len("sqlite:///"):]) as conn:
            return conn.execute(statement, params).fetchall()
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        cur = conn.execute(statement.replace("?", "%s"), params)
        return cur.fetchall() if cur.description else []


def test_appends_persist_and_reload_to_the_same_store(store_url):
    users = UserMemories(store_url, _Models())
    for turns in TURNS:
        users.append("ana", turns)
    reloaded = UserMemories(store_url, _Models())
    assert reloaded.user_ids() == ["ana"]
    assert _facts(reloaded, "ana") == _facts(users, "ana") and len(_facts(users, "ana")) == 4
    assert reloaded.replayed_sessions == 0  # the snapshot holds all four
    with pytest.raises(UnknownUser):
        reloaded.get("bob")
    assert _sql(store_url, "SELECT seq FROM changes WHERE user_id = ? ORDER BY seq", ("ana",)) == [(0,), (1,), (2,), (3,)]


def test_changes_past_the_snapshot_are_replayed_and_a_damaged_snapshot_is_rebuilt(store_url):
    users = UserMemories(store_url, _Models(), snapshot_every=2)
    for turns in TURNS[:3]:
        users.append("ana", turns)  # a snapshot after session 2; session 3 only in the log
    assert _sql(store_url, "SELECT seq FROM snapshots WHERE user_id = ?", ("ana",)) == [(2,)]
    reloaded = UserMemories(store_url, _Models(), snapshot_every=5)
    assert _facts(reloaded, "ana") == _facts(users, "ana") and reloaded.replayed_sessions == 1
    _sql(store_url, "UPDATE snapshots SET units = ? WHERE user_id = ?", ("garbage\n", "ana"))  # fails its checksum
    again = UserMemories(store_url, _Models(), snapshot_every=5)
    assert _facts(again, "ana") == _facts(users, "ana") and again.replayed_sessions == 3


@pytest.mark.parametrize("bad", ["", ".", "..", "a/b", "a b", "é", "x" * 129, "../x"])
def test_user_ids_are_checked(bad):
    with pytest.raises(BadUserId):
        check_user_id(bad)
    assert check_user_id("user-1_A.b") == "user-1_A.b" and check_user_id("x" * 128)


def test_idempotency_keys_are_unique_per_user_in_the_database(store_url):
    users = UserMemories(store_url, _Models())
    first = users.append("ana", TURNS[0], key="k")
    assert users.append("ana", TURNS[0], key="k") == {**{k: v for k, v in first.items() if k != "seconds"},
                                                      "replayed": True}
    assert not users.append("bob", TURNS[0], key="k").get("replayed")  # per user: bob's "k" is his own
    with pytest.raises(IdempotencyConflict):
        users.append("ana", TURNS[1], key="k")
    with pytest.raises(Exception, match="(?i)unique|duplicate"):  # the database refuses a second row
        _sql(store_url, "INSERT INTO idempotency_keys (user_id, key, digest, result, seq) VALUES (?, ?, ?, ?, ?)",
             ("ana", "k", "x", "{}", 9))
    assert len(_facts(users, "ana")) == 1


def test_a_store_of_the_previous_schema_is_upgraded_with_nothing_lost(store_url, tmp_path):
    """Schema 1 (no ``changes.created_at``), written as that version wrote it: a user with a snapshot
    after two sessions, a third session past it and a key. Opened today: migrated to the last schema,
    the user loads the same, the key still holds, and new changes carry their time."""
    reference = UserMemories(f"sqlite:///{tmp_path / 'reference.db'}", _Models())
    for turns in TURNS[:3]:
        reference.append("ana", turns)
    entries = list(reference.export("ana"))
    two = UserMemories(f"sqlite:///{tmp_path / 'two.db'}", _Models())
    for entry in entries[:2]:
        two.append("ana", entry["turns"], entry["time"])
    snapshot = encode_snapshot(two.get("ana").store)
    blob = "BYTEA" if store_url.startswith("postgres") else "BLOB"
    for statement in ("CREATE TABLE schema_version (version INTEGER NOT NULL)",
                      "INSERT INTO schema_version (version) VALUES (1)",
                      *(s.format(blob=blob) for s in MIGRATIONS[1])):
        _sql(store_url, statement)
    _sql(store_url, "INSERT INTO users (user_id, version) VALUES (?, ?)", ("ana", 3))
    for seq, entry in enumerate(entries):
        _sql(store_url, "INSERT INTO changes (user_id, seq, entry) VALUES (?, ?, ?)", ("ana", seq, json.dumps(entry)))
    _sql(store_url, "INSERT INTO idempotency_keys (user_id, key, digest, result, seq) VALUES (?, ?, ?, ?, ?)",
         ("ana", "k", "d", json.dumps({"user": "ana", "session": 2}), 2))
    _sql(store_url, "INSERT INTO snapshots (user_id, seq, meta, units, traces, embeddings, sha256) VALUES "
                    "(?, ?, ?, ?, ?, ?, ?)", ("ana", 2, snapshot["meta"], snapshot["units"], snapshot["traces"],
                                              snapshot["embeddings"], snapshot["sha256"]))
    users = UserMemories(store_url, _Models())
    assert users.store.schema_version() == SCHEMA_VERSION == 3
    assert users.store.version("ana") == ("", 3)  # created before users had a generation
    assert _facts(users, "ana") == _facts(reference, "ana") and users.replayed_sessions == 1
    assert users.store.first_result("ana", "k") == ("d", {"user": "ana", "session": 2})
    users.append("ana", TURNS[3])
    times = _sql(store_url, "SELECT created_at FROM changes WHERE user_id = ? ORDER BY seq", ("ana",))
    assert [t is None for (t,) in times] == [True, True, True, False]


def test_a_store_of_a_newer_schema_is_refused(store_url):
    open_store(store_url).close()
    _sql(store_url, "UPDATE schema_version SET version = ?", (SCHEMA_VERSION + 1,))
    with pytest.raises(NewerSchema, match=f"schema version {SCHEMA_VERSION + 1}"):
        open_store(store_url)


def test_two_replicas_over_one_store_see_each_others_writes(store_url):
    """Replica A and B hold ana loaded; each answers with what the other acknowledged (appends, a key,
    a forget, a delete), because every request checks the stored version first."""
    a, b = UserMemories(store_url, _Models()), UserMemories(store_url, _Models())
    a.append("ana", TURNS[0])
    assert _facts(b, "ana") == _facts(a, "ana")  # B loads ana now
    a.append("ana", TURNS[1], key="k1")
    with b.hold("ana") as held:
        assert [u.fact for u in held.store.units] == _facts(a, "ana") and len(held.store) == 2
    assert b.append("ana", TURNS[1], key="k1")["replayed"]  # a key holds across replicas
    assert b.append("ana", TURNS[2])["session"] == 2
    with a.hold("ana") as held:
        assert len(held.store) == 3
        unit = held.store.units[0].id
    b.forget("ana", unit)
    with a.hold("ana") as held:
        assert unit not in {u.id for u in held.store.units}
    a.delete("ana")
    with pytest.raises(UnknownUser):
        with b.hold("ana"):
            pass
    assert b.append("ana", TURNS[3])["session"] == 0  # a new ana, from nothing


@pytest.mark.parametrize("again", [2, 3], ids=["as-many-changes", "more-changes"])
def test_a_replica_holding_a_user_deleted_and_created_again_loads_the_new_one(store_url, again):
    """Replica B holds ana after two sessions; A deletes ana and creates her again with as many, or more,
    sessions. B's next request serves the new ana, never the old one with the new changes on top, and
    a snapshot B saves of the old one is not stored over the new one's."""
    a, b = UserMemories(store_url, _Models()), UserMemories(store_url, _Models())
    for turns in TURNS[:2]:
        a.append("ana", turns)
    assert len(_facts(b, "ana")) == 2
    with b.hold("ana") as held:
        stale = held
    a.delete("ana")
    for turns in TURNS[4 - again:]:
        a.append("ana", turns)
    b.store.save_snapshot("ana", stale.generation, stale.lines, stale.store)  # what unloading the old one writes
    with b.hold("ana") as held:
        assert [u.fact for u in held.store.units] == _facts(a, "ana") and len(held.store) == again
    assert _sql(store_url, "SELECT seq FROM snapshots WHERE user_id = ?", ("ana",)) == [(again,)]
    fresh = UserMemories(store_url, _Models())  # a cold load reads the new ana whole
    assert _facts(fresh, "ana") == _facts(a, "ana")
    assert b.append("ana", TURNS[0])["session"] == again  # B writes on the new one
