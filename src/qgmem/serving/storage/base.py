"""The storage interface of the memory service and the SQL both databases share.

The schema (``MIGRATIONS``; its version is the one row of ``schema_version``)::

    users             user_id, version, generation  version: changes stored for the user; generation:
                                                    made anew each time the user is created, so a user
                                                    deleted and created again is another user (the cheap
                                                    check a replica makes before it answers reads both)
    changes           user_id, seq, entry, created_at   the append-only log: one appended session
                                                    ({"turns", "time"}) or forgotten unit ({"forget"})
                                                    per row, seq 0, 1, … per user
    idempotency_keys  user_id, key, digest, result, seq   unique per user (the primary key)
    snapshots         user_id, seq, meta, units, traces, embeddings, sha256
                                                    the user's MemoryStore after its first seq changes,
                                                    so a cold load replays only the changes after it

A write is one transaction: the changes, the key, the user's new version and (when due) the snapshot
are committed together or not at all, and nothing is acknowledged before the commit. A write names the
version it was computed on; when another writer (another replica) moved the user on meanwhile, nothing
is written and the caller catches up and computes again.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
import uuid
from abc import ABC, abstractmethod
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, NamedTuple

import numpy as np

from qgmem.errors import UserError

log = logging.getLogger("qgmem.serve")

#: schema version -> its statements; a database is brought from its version to the last one at open
MIGRATIONS: dict[int, tuple[str, ...]] = {
    1: ("CREATE TABLE users (user_id TEXT PRIMARY KEY, version BIGINT NOT NULL)",
        "CREATE TABLE changes (user_id TEXT NOT NULL, seq BIGINT NOT NULL, entry TEXT NOT NULL, "
        "PRIMARY KEY (user_id, seq))",
        "CREATE TABLE idempotency_keys (user_id TEXT NOT NULL, key TEXT NOT NULL, digest TEXT NOT NULL, "
        "result TEXT NOT NULL, seq BIGINT NOT NULL, PRIMARY KEY (user_id, key))",
        "CREATE TABLE snapshots (user_id TEXT PRIMARY KEY, seq BIGINT NOT NULL, meta TEXT NOT NULL, "
        "units TEXT NOT NULL, traces TEXT NOT NULL, embeddings {blob} NOT NULL, sha256 TEXT NOT NULL)"),
    # when each change was acknowledged (seconds since the epoch; NULL for changes stored before)
    2: ("ALTER TABLE changes ADD COLUMN created_at DOUBLE PRECISION",),
    # a random id per creation of a user (NULL, read as '', for users created before)
    3: ("ALTER TABLE users ADD COLUMN generation TEXT",),
}
SCHEMA_VERSION = max(MIGRATIONS)
#: user rows read per query when a user's changes are exported
PAGE = 1000


class Version(NamedTuple):
    """Where a stored user stands: which creation of the user (``generation``) and how many changes it holds.

    A replica holding a user compares both: the same count of another generation (the user was deleted
    and created again meanwhile) is another user, never changes to replay."""

    generation: str
    changes: int


class StoreUnavailable(Exception):
    """The database cannot be reached or is busy (503 with Retry-After; nothing of the request was stored)."""


class StoreFull(Exception):
    """The database's disk is full (507; nothing of the request was stored)."""


class NewerSchema(UserError):
    """A database written by a newer qgmem (its schema version is past this one's)."""


def _sha256(*parts: bytes) -> str:
    digest = hashlib.sha256()
    for part in parts:
        digest.update(hashlib.sha256(part).digest())
    return digest.hexdigest()


def encode_snapshot(store: Any) -> dict[str, Any]:
    """A :class:`~qgmem.memory.store.MemoryStore` as a snapshot row's columns (with their checksum)."""
    from safetensors.numpy import save

    embeddings = np.ascontiguousarray(store.embeddings, dtype=np.float32)
    tensors = {"embeddings": embeddings}
    if store.source_embeddings is not None:
        tensors["source_embeddings"] = np.ascontiguousarray(store.source_embeddings, dtype=np.float32)
    row = {"meta": json.dumps({**store.meta, "dialogue_id": store.dialogue_id}, ensure_ascii=False, sort_keys=True),
           "units": "".join(json.dumps(u.to_dict(), ensure_ascii=False) + "\n" for u in store.units),
           "traces": "".join(json.dumps(t.to_dict(), ensure_ascii=False) + "\n" for t in store.traces),
           "embeddings": save(tensors)}
    row["sha256"] = _sha256(row["meta"].encode(), row["units"].encode(), row["traces"].encode(), row["embeddings"])
    return row


def decode_snapshot(row: dict[str, Any]) -> Any:
    """The MemoryStore of a snapshot row; ``None`` when it fails its checksum (the log rebuilds it)."""
    from safetensors.numpy import load

    from qgmem.memory.records import MemoryTrace, MemoryUnit
    from qgmem.memory.store import MemoryStore

    blob = bytes(row["embeddings"])
    if row["sha256"] != _sha256(row["meta"].encode(), row["units"].encode(), row["traces"].encode(), blob):
        return None
    meta = json.loads(row["meta"])
    tensors = load(blob)
    return MemoryStore(dialogue_id=meta.pop("dialogue_id"),
                       units=[MemoryUnit.from_dict(json.loads(x)) for x in row["units"].splitlines() if x],
                       traces=[MemoryTrace.from_dict(json.loads(x)) for x in row["traces"].splitlines() if x],
                       embeddings=tensors["embeddings"], meta=meta, source_embeddings=tensors.get("source_embeddings"))


class Store(ABC):
    """What the memory service stores per user. ``entry``: ``{"turns", "time"}`` (a session) or
    ``{"forget": unit id}``; a user's :class:`Version` is the user's generation and the number of changes
    stored for them."""

    url: str

    @abstractmethod
    def version(self, user_id: str) -> Version | None:
        """The user's version; ``None``: no such user."""

    @abstractmethod
    def user_ids(self) -> list[str]: ...

    @abstractmethod
    def load(self, user_id: str) -> tuple[str, int, Any, list[dict[str, Any]]] | None:
        """``(generation, snapshot seq, MemoryStore or None, the changes after it)`` read in one transaction;
        ``None``: no such user. A snapshot that fails its checksum is skipped (logged): every change is replayed."""

    @abstractmethod
    def changes(self, user_id: str, after: int, upto: int | None = None) -> list[dict[str, Any]]:
        """The user's changes ``after <= seq < upto`` in order."""

    @abstractmethod
    def first_result(self, user_id: str, key: str) -> tuple[str, dict[str, Any]] | None:
        """``(digest, result)`` stored with ``key`` for the user."""

    @abstractmethod
    def commit(self, user_id: str, expected: Version | None, entries: list[dict[str, Any]], *,
               key: tuple[str, str, dict[str, Any]] | None = None, snapshot: Any = None) -> Version | None:
        """Store ``entries`` as the user's next changes, with ``key`` ``(key, digest, result)`` and the
        ``snapshot`` (the MemoryStore after them), in one transaction; returns the user's new version.
        ``expected`` ``None`` creates the user (a new generation). ``None``, writing nothing, when the user's
        version is no longer ``expected`` (another writer stored changes first, or deleted or created the user)."""

    @abstractmethod
    def save_snapshot(self, user_id: str, generation: str, seq: int, store: Any) -> None:
        """Store a snapshot after ``seq`` changes unless a newer one is there, or the user is not of
        ``generation`` any more (deleted, or deleted and created again)."""

    @abstractmethod
    def import_user(self, user_id: str, entries: list[dict[str, Any]], snapshot: Any,
                    keys: list[tuple[str, str, dict[str, Any], int]] = (), snapshot_seq: int | None = None) -> bool:
        """A new user with ``entries`` as their changes (and ``keys``: ``(key, digest, result, seq)``) and
        ``snapshot`` after ``snapshot_seq`` of them (default: all), in one transaction; False, writing
        nothing, when the user exists."""

    @abstractmethod
    def delete(self, user_id: str) -> bool:
        """Every row of the user removed in one transaction; False when there was none."""

    def export(self, user_id: str, upto: int) -> Iterator[dict[str, Any]]:
        """The user's first ``upto`` changes, read a page at a time (a large user is never held whole)."""
        for start in range(0, upto, PAGE):
            yield from self.changes(user_id, start, min(upto, start + PAGE))

    def close(self) -> None:  # noqa: B027 - a backend without resources has nothing to close
        """Release the connections."""


class SqlStore(Store):
    """The schema and statements both backends share; a backend gives connections, transactions and the
    per-user write lock. Statements are written with ``?`` placeholders (``PARAM`` replaces them)."""

    PARAM = "?"
    BLOB = "BLOB"

    @abstractmethod
    def _transaction(self, write_user: str | None = None):
        """A context manager: a cursor inside one transaction, committed at its end (rolled back on an
        error). ``write_user``: a write to that user (the backend serializes writers of one user)."""

    @abstractmethod
    def _failure(self, exc: BaseException) -> BaseException | None:
        """The :class:`StoreUnavailable` / :class:`StoreFull` a database error means, or None (a bug)."""

    @contextmanager
    def _tx(self, write_user: str | None = None):
        try:
            with self._transaction(write_user) as cur:
                yield cur
        except (StoreUnavailable, StoreFull, UserError):
            raise
        except Exception as exc:  # noqa: BLE001 - translated when it is the database's state, else re-raised
            failure = self._failure(exc)
            if failure is None:
                raise
            raise failure from exc

    def _q(self, sql: str) -> str:
        return sql if self.PARAM == "?" else sql.replace("?", self.PARAM)

    def _run(self, cur, sql: str, params: tuple = ()) -> Any:
        cur.execute(self._q(sql), params)
        return cur

    # --------------------------------------------------------------------------------- schema
    def _migrate(self, cur) -> None:
        """Bring the schema to :data:`SCHEMA_VERSION` (each migration's statements in this transaction)."""
        self._run(cur, "CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL)")
        row = self._run(cur, "SELECT version FROM schema_version").fetchone()
        current = 0 if row is None else int(row[0])
        if current > SCHEMA_VERSION:
            raise NewerSchema(f"store {self.url_shown()} has schema version {current}, newer than this qgmem's "
                              f"{SCHEMA_VERSION}: upgrade qgmem")
        for version in range(current + 1, SCHEMA_VERSION + 1):
            for statement in MIGRATIONS[version]:
                self._run(cur, statement.format(blob=self.BLOB))
            log.info("store %s: schema migrated to version %d", self.url_shown(), version)
        if row is None:
            self._run(cur, "INSERT INTO schema_version (version) VALUES (?)", (SCHEMA_VERSION,))
        elif current != SCHEMA_VERSION:
            self._run(cur, "UPDATE schema_version SET version = ?", (SCHEMA_VERSION,))

    def schema_version(self) -> int:
        with self._tx() as cur:
            return int(self._run(cur, "SELECT version FROM schema_version").fetchone()[0])

    def url_shown(self) -> str:
        """The URL without a password (it names the store in messages)."""
        return self.url

    # ---------------------------------------------------------------------------------- reads
    def _version(self, cur, user_id: str) -> Version | None:
        row = self._run(cur, "SELECT generation, version FROM users WHERE user_id = ?", (user_id,)).fetchone()
        return None if row is None else Version(row[0] or "", int(row[1]))

    def _create_user(self, cur, user_id: str, changes: int) -> Version:
        generation = uuid.uuid4().hex
        self._run(cur, "INSERT INTO users (user_id, version, generation) VALUES (?, ?, ?)",
                  (user_id, changes, generation))
        return Version(generation, changes)

    def version(self, user_id: str) -> Version | None:
        with self._tx() as cur:
            return self._version(cur, user_id)

    def user_ids(self) -> list[str]:
        with self._tx() as cur:
            return [r[0] for r in self._run(cur, "SELECT user_id FROM users ORDER BY user_id").fetchall()]

    def load(self, user_id: str):
        with self._tx() as cur:
            version = self._version(cur, user_id)
            if version is None:
                return None
            row = self._run(cur, "SELECT seq, meta, units, traces, embeddings, sha256 FROM snapshots "
                                 "WHERE user_id = ?", (user_id,)).fetchone()
            store, seq = None, 0
            if row is not None:
                store = decode_snapshot(dict(zip(("meta", "units", "traces", "embeddings", "sha256"), row[1:])))
                if store is None or store.dialogue_id != user_id:
                    log.warning("user %s: the snapshot failed its checksum; rebuilt from the changes", user_id)
                    store = None
                else:
                    seq = int(row[0])
            return version.generation, seq, store, self._changes(cur, user_id, seq, None)

    def _changes(self, cur, user_id: str, after: int, upto: int | None) -> list[dict[str, Any]]:
        sql, params = "SELECT entry FROM changes WHERE user_id = ? AND seq >= ?", (user_id, after)
        if upto is not None:
            sql, params = sql + " AND seq < ?", (*params, upto)
        return [json.loads(r[0]) for r in self._run(cur, sql + " ORDER BY seq", params).fetchall()]

    def changes(self, user_id: str, after: int, upto: int | None = None) -> list[dict[str, Any]]:
        with self._tx() as cur:
            return self._changes(cur, user_id, after, upto)

    def first_result(self, user_id: str, key: str):
        with self._tx() as cur:
            row = self._run(cur, "SELECT digest, result FROM idempotency_keys WHERE user_id = ? AND key = ?",
                            (user_id, key)).fetchone()
        return None if row is None else (row[0], json.loads(row[1]))

    # --------------------------------------------------------------------------------- writes
    def _insert_changes(self, cur, user_id: str, start: int, entries: list[dict[str, Any]]) -> None:
        now = time.time()
        for seq, entry in enumerate(entries, start=start):
            self._run(cur, "INSERT INTO changes (user_id, seq, entry, created_at) VALUES (?, ?, ?, ?)",
                      (user_id, seq, json.dumps(entry, ensure_ascii=False), now))

    def _insert_key(self, cur, user_id: str, key: str, digest: str, result: dict[str, Any], seq: int) -> None:
        self._run(cur, "INSERT INTO idempotency_keys (user_id, key, digest, result, seq) VALUES (?, ?, ?, ?, ?)",
                  (user_id, key, digest, json.dumps(result, ensure_ascii=False), seq))

    def _upsert_snapshot(self, cur, user_id: str, seq: int, store: Any) -> None:
        row = encode_snapshot(store)
        self._run(cur, "INSERT INTO snapshots (user_id, seq, meta, units, traces, embeddings, sha256) "
                       "VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT (user_id) DO UPDATE SET seq = excluded.seq, "
                       "meta = excluded.meta, units = excluded.units, traces = excluded.traces, "
                       "embeddings = excluded.embeddings, sha256 = excluded.sha256 WHERE snapshots.seq < excluded.seq",
                  (user_id, seq, row["meta"], row["units"], row["traces"], row["embeddings"], row["sha256"]))

    def commit(self, user_id, expected, entries, *, key=None, snapshot=None) -> Version | None:
        with self._tx(write_user=user_id) as cur:
            current = self._version(cur, user_id)
            if current is None and expected is None:
                start, new = 0, self._create_user(cur, user_id, len(entries))
            elif current is not None and current == expected:
                start, new = current.changes, Version(current.generation, current.changes + len(entries))
                self._run(cur, "UPDATE users SET version = ? WHERE user_id = ?", (new.changes, user_id))
            else:
                return None
            self._insert_changes(cur, user_id, start, entries)
            if key is not None:
                self._insert_key(cur, user_id, *key, new.changes - 1)
            if snapshot is not None:
                self._upsert_snapshot(cur, user_id, new.changes, snapshot)
        return new

    def save_snapshot(self, user_id: str, generation: str, seq: int, store: Any) -> None:
        with self._tx(write_user=user_id) as cur:
            current = self._version(cur, user_id)
            if current is not None and current.generation == generation and seq <= current.changes:
                self._upsert_snapshot(cur, user_id, seq, store)

    def import_user(self, user_id, entries, snapshot, keys=(), snapshot_seq=None) -> bool:
        with self._tx(write_user=user_id) as cur:
            if self._version(cur, user_id) is not None:
                return False
            self._create_user(cur, user_id, len(entries))
            self._insert_changes(cur, user_id, 0, entries)
            for key, digest, result, seq in keys:
                self._insert_key(cur, user_id, key, digest, result, seq)
            seq = len(entries) if snapshot_seq is None else snapshot_seq
            if snapshot is not None and seq:
                self._upsert_snapshot(cur, user_id, seq, snapshot)
        return True

    def delete(self, user_id: str) -> bool:
        with self._tx(write_user=user_id) as cur:
            found = self._run(cur, "DELETE FROM users WHERE user_id = ?", (user_id,)).rowcount > 0
            for table in ("changes", "idempotency_keys", "snapshots"):
                self._run(cur, f"DELETE FROM {table} WHERE user_id = ?", (user_id,))
        return found
