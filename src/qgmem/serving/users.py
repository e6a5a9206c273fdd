"""The users' memories of ``qgmem serve``: loaded on first use, kept in this process, stored in a database.

:class:`UserMemories` holds the cache of loaded users (one :class:`~qgmem.activation.memory.Memory` each,
with its lock), the budgets that unload them, and the replay of a user's changes; what is stored, and
how, is a :class:`~qgmem.serving.storage.base.Store` (SQLite or Postgres, :mod:`qgmem.serving.storage`).

A write (an append, a batch, a forget) is computed on the user's memory in this process, then committed
with the version it was computed on: the changes, the idempotency key and, every ``snapshot_every``
changes, a snapshot go in one transaction, and the reply comes after the commit. When another replica
stored changes for the user first, nothing is written; the changes it stored are replayed here and the
write is computed again. Every request compares the user's stored version with the one held here (one
indexed read), so a replica answers with what any other replica acknowledged.

Each user's memory is separate data (its own store, indexes and activator) and the user id is checked
against :data:`USER_ID`: isolation is a filter by construction, not a field in a shared index.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from qgmem.activation.memory import Memory
from qgmem.data.records import Session, Turn
from qgmem.errors import UserError
from qgmem.memory.store import MemoryStore
from qgmem.serving.history_file import ASSISTANT_SPEAKERS
from qgmem.serving.journal import batch_digest, session_digest
from qgmem.serving.storage import open_store
from qgmem.serving.storage.base import Store, Version

#: what a user id may be (it names the user in URLs, logs and the store; never "." or "..")
USER_ID = re.compile(r"[A-Za-z0-9_.-]{1,128}")
log = logging.getLogger("qgmem.serve")


class BadUserId(UserError, ValueError):
    """A user id outside ``[A-Za-z0-9_.-]{1,128}`` (or a bare ``.``/``..``)."""


class UnknownUser(UserError, LookupError):
    """No memory for this user (nothing was ever appended)."""


class IdempotencyConflict(UserError):
    """An idempotency key reused for another session."""


class UserExists(UserError):
    """An import into a user that already has a memory (409)."""


class UnknownUnit(UserError, LookupError):
    """No memory unit with this id in the user's memory (never stored, or forgotten: 404)."""


def check_user_id(user_id: str) -> str:
    if not isinstance(user_id, str) or not USER_ID.fullmatch(user_id) or user_id in (".", ".."):
        raise BadUserId(f"user id {str(user_id)[:40]!r} must match [A-Za-z0-9_.-]{{1,128}} (and not be '.' or '..')")
    return user_id


def to_session(turns: list[dict[str, Any]], session_time: str | None = None) -> Session:
    """A :class:`Session` of checked plain turns (ids and indices are given when it is appended)."""
    out = []
    for i, t in enumerate(turns):
        role = "assistant" if t["speaker"].strip().lower() in ASSISTANT_SPEAKERS else "user"
        out.append(Turn(id=str(i), session_id="new", speaker=t["speaker"], role=role, text=t["text"],
                        time=t.get("time") or session_time))
    return Session(id="new", turns=out, time=session_time)


def session_count(store: MemoryStore) -> int:
    """Sessions appended to ``store`` so far (the next one's index; forgets do not change it)."""
    return int((store.meta.get("extent") or {}).get("sessions", 0))


def store_without(builder: Any, store: MemoryStore, unit_ids: set[str]) -> MemoryStore:
    """``store`` without ``unit_ids``, its traces regrouped over the units left (as construction groups
    them), so no trace holds a removed state; the numbering (``extent``) and the rest of ``meta`` as before."""
    from qgmem.memory.remove import without_units

    llm = builder.llm if builder.uses_llm_consolidation else None
    kept = without_units(store, unit_ids, builder.encoder.encode, builder.config, llm=llm)
    kept.meta = dict(store.meta)
    return kept


def forget_units(builder: Any, store: MemoryStore, unit_ids: set[str]) -> MemoryStore:
    """``store`` with ``unit_ids`` forgotten (:func:`store_without`, the count kept in ``meta``)."""
    kept = store_without(builder, store, unit_ids)
    kept.meta["forgotten_units"] = int(store.meta.get("forgotten_units", 0)) + len(unit_ids)
    return kept


def applyparse_line(pipeline: Any, memory: Memory, entry: dict[str, Any]) -> Memory:
    """One stored change (or export entry) applied to ``memory``: a session appended, or a unit forgotten
    (a new memory over the store without it: its trace index is rebuilt at the next append, its
    activator at the next question, since extending the old one would keep the unit's rows). Load,
    import and the live calls all go through here, so they give the same memory."""
    if "forget" in entry:
        return pipeline.open_memory(forget_units(pipeline.builder(), memory.store, {entry["forget"]}))
    return memory.appended(pipeline.builder(), [to_session(entry["turns"], entry.get("time"))])


@dataclass
class UserMemory:
    """One user's :class:`~qgmem.activation.memory.Memory` (store, trace index, activator), the number of
    the user's changes it holds and the newest snapshot's, behind one lock."""

    user_id: str
    memory: Memory
    lines: int = 0  # changes applied (the user's version this process holds)
    generation: str | None = None  # which creation of the user this is (None: not stored yet)
    lock: threading.RLock = field(default_factory=threading.RLock)
    snapshot_seq: int = 0  # changes the newest stored snapshot holds
    last_used: float = field(default_factory=time.monotonic)
    gone: bool = False  # unloaded or deleted: a caller holding this object looks the user up again

    @property
    def store(self) -> MemoryStore:
        return self.memory.store


class UserMemories:
    """The users' memories in ``store`` (a :class:`Store` or its URL), loaded on first use, written in
    transactions."""

    def __init__(self, store: Store | str, pipeline: Any, snapshot_every: int = 1, *,
                 max_loaded_users: int | None = None, max_loaded_units: int | None = None,
                 idle_unload_s: float | None = None):
        if snapshot_every < 1:
            raise UserError(f"snapshot_every must be >= 1, got {snapshot_every}")
        self.max_loaded_users, self.max_loaded_units, self.idle_unload_s = max_loaded_users, max_loaded_units, idle_unload_s
        self.unloaded = 0  # users unloaded (idle or past the budget); reloaded from the store on their next request
        self.store = open_store(store) if isinstance(store, str) else store
        self.pipeline = pipeline
        self.snapshot_every = snapshot_every
        self._users: dict[str, UserMemory] = {}
        self._lock = threading.Lock()
        self.replayed_sessions = 0  # changes replayed (at load, and those another replica stored)
        self.retried_writes = 0  # writes computed again because another replica stored changes first

    # ---------------------------------------------------------------------------------- lookup
    def exists(self, user_id: str) -> bool:
        check_user_id(user_id)
        return self.store.version(user_id) is not None

    def user_ids(self) -> list[str]:
        return self.store.user_ids()

    def get(self, user_id: str, create: bool = False) -> UserMemory:
        """The user's memory, loaded from the store on first use; :class:`UnknownUser` unless ``create``."""
        check_user_id(user_id)
        with self._lock:
            user = self._users.get(user_id)
        if user is None:
            user = self._load(user_id)
            if user is None:
                if not create:
                    raise UnknownUser(f"no memory for user {user_id!r}: append a session first "
                                      f"(POST /v1/users/{user_id}/sessions)")
                user = UserMemory(user_id, self._empty_memory(user_id))
            with self._lock:  # a request that loaded the user meanwhile wins; this copy is dropped
                user = self._users.setdefault(user_id, user)
        user.last_used = time.monotonic()
        self._unload_past_budget(keep=user_id)
        return user

    @contextmanager
    def hold(self, user_id: str, create: bool = False) -> Iterator[UserMemory]:
        """The user's memory with its lock held and brought up to the stored version: what every read and
        write of one user goes through, so a user unloaded (or deleted) between the lookup and the lock is
        looked up again, never used, and another replica's changes are there before the answer."""
        while True:
            user = self.get(user_id, create=create)
            with user.lock:
                if user.gone or not self._caught_up(user):
                    continue
                user.last_used = time.monotonic()
                yield user
                return

    def _caught_up(self, user: UserMemory) -> bool:
        """Replay the changes another writer stored past ``user.lines``; False (the user dropped from the
        cache, to be looked up again) when the stored user is gone or was replaced (deleted, imported)."""
        version = self.store.version(user.user_id)
        if version is None:
            if user.generation is None and user.lines == 0:  # not stored yet: its first write creates it
                return True
        elif user.generation in (None, version.generation):  # None: created by another writer meanwhile
            if version.changes == user.lines:
                user.generation = version.generation
                return True
            if version.changes > user.lines:
                changes = self.store.changes(user.user_id, user.lines, version.changes)
                if len(changes) == version.changes - user.lines:
                    for entry in changes:
                        user.memory = applyparse_line(self.pipeline, user.memory, entry)
                    user.lines, user.generation = version.changes, version.generation
                    self.replayed_sessions += len(changes)
                    return True
        self._drop(user)
        return False

    def _drop(self, user: UserMemory) -> None:
        user.gone = True
        with self._lock:
            if self._users.get(user.user_id) is user:
                del self._users[user.user_id]

    # ------------------------------------------------------------------------------ unloading
    def unload_idle(self, now: float | None = None) -> int:
        """Unload the users idle for longer than ``idle_unload_s``; returns how many."""
        if self.idle_unload_s is None:
            return 0
        now = time.monotonic() if now is None else now
        idle = [u for u in list(self._users.values()) if now - u.last_used > self.idle_unload_s]
        return sum(self._unload(u) for u in idle)

    def _unload_past_budget(self, keep: str) -> None:
        """Least recently used first, until within ``max_loaded_users`` / ``max_loaded_units``."""
        if self.max_loaded_users is None and self.max_loaded_units is None:
            return
        for user in sorted(list(self._users.values()), key=lambda u: u.last_used):
            over_users = self.max_loaded_users is not None and len(self._users) > self.max_loaded_users
            over_units = self.max_loaded_units is not None and self.units() > self.max_loaded_units
            if not (over_users or over_units):
                return
            if user.user_id != keep:
                self._unload(user)

    def _unload(self, user: UserMemory) -> bool:
        """Drop a user's memory from this process (its snapshot brought up to date first); a user in use
        (its lock held) is left loaded. The next request reloads it from its snapshot and changes."""
        if not user.lock.acquire(blocking=False):
            return False
        try:
            if user.gone:
                return False
            if user.lines > user.snapshot_seq:
                self.store.save_snapshot(user.user_id, user.generation, user.lines, user.store)
            self._drop(user)
            self.unloaded += 1
            return True
        finally:
            user.lock.release()

    def delete(self, user_id: str) -> bool:
        """Forget a user: every row of theirs removed in one transaction, and unloaded. False when there
        was nothing to delete."""
        check_user_id(user_id)
        with self._lock:
            user = self._users.get(user_id)
        if user is None:
            return self.store.delete(user_id)
        with user.lock:
            found = self.store.delete(user_id)
            self._drop(user)
            return found

    def loaded(self) -> int:
        return len(self._users)

    def units(self) -> int:
        return sum(len(u.store) for u in list(self._users.values()))

    # ---------------------------------------------------------------------------------- append
    def append(self, user_id: str, turns: list[dict[str, Any]], session_time: str | None = None,
               key: str | None = None) -> dict[str, Any]:
        """Append one session (checked plain turns) to the user's memory; returns once it is committed.

        ``key``: an idempotency key. A session appended before with the same key is not stored again:
        the first append's result is returned (``"replayed": true``); the same key with another
        session is an :class:`IdempotencyConflict`. Keys are stored with the changes (unique per user in
        the database), so this holds across restarts, unloading and replicas."""
        return self.append_batch(user_id, [(turns, session_time)], key, single=True)

    def append_batch(self, user_id: str, sessions: list[tuple[list[dict[str, Any]], str | None]],
                     key: str | None = None, *, single: bool = False) -> dict[str, Any]:
        """Append several sessions ``[(turns, time), …]`` in order, one change each, committed in one
        transaction: the reply comes once all are stored, and a failure before that leaves none of them.
        ``key`` makes the whole batch idempotent, as :meth:`append`'s key does one session. ``single``:
        :meth:`append`'s reply (one session)."""
        digest = session_digest(*sessions[0]) if single else batch_digest(sessions)
        while True:
            with self.hold(user_id, create=True) as user:
                if key is not None:
                    first = self.store.first_result(user_id, key)
                    if first is not None:
                        if first[0] != digest:
                            raise IdempotencyConflict(f"Idempotency-Key {key!r} was used for another "
                                                      f"{'session' if single else 'batch'} of user {user_id!r}; "
                                                      "use a new key for new sessions")
                        return {**first[1], "replayed": True}
                t0 = time.perf_counter()
                memory, added = user.memory, []
                for turns, when in sessions:
                    grown = applyparse_line(self.pipeline, memory, {"turns": turns, "time": when})
                    added.append({"session": session_count(memory.store), "units_added": len(grown) - len(memory)})
                    memory = grown
                store = memory.store
                totals = {"units": len(store), "traces": len(store.traces)}
                result = ({"user": user_id, **added[0], **totals} if single
                          else {"user": user_id, "sessions": added, **totals})
                entries = [{"turns": turns, "time": when} for turns, when in sessions]
                t1 = time.perf_counter()
                if not self._commit(user, memory, entries, None if key is None else (key, digest, result)):
                    continue
                t2 = time.perf_counter()
                return {**result, "seconds": {"construction": t1 - t0, "commit": t2 - t1, "total": t2 - t0}}

    def forget(self, user_id: str, unit_id: str) -> dict[str, Any]:
        """Forget one memory unit: stored as a change (a restart does not bring it back) with the snapshot
        in one transaction, and removed from the store with the traces regrouped over the units left, so
        no answer, search, trace or graph holds it again. A unit that is not there (never, or forgotten
        before) is an :class:`UnknownUnit` (404)."""
        while True:
            with self.hold(user_id) as user:
                if unit_id not in {u.id for u in user.store.units}:
                    raise UnknownUnit(f"user {user_id!r} has no memory unit {unit_id[:100]!r} (never stored, or "
                                      "forgotten already)")
                memory = applyparse_line(self.pipeline, user.memory, {"forget": unit_id})
                if not self._commit(user, memory, [{"forget": unit_id}], None):
                    continue
                store = memory.store
                return {"user": user_id, "unit_id": unit_id, "forgotten": True, "units": len(store),
                        "traces": len(store.traces)}

    def _commit(self, user: UserMemory, memory: Memory, entries: list[dict[str, Any]],
                key: tuple[str, str, dict[str, Any]] | None) -> bool:
        """Commit ``entries`` (computed on ``user.lines`` changes into ``memory``), with the snapshot when
        due; then ``memory`` is the user's. False: another writer was first (caught up at the next hold)."""
        lines = user.lines + len(entries)
        snapshot = memory.store if lines - user.snapshot_seq >= self.snapshot_every else None
        expected = None if user.generation is None else Version(user.generation, user.lines)
        version = self.store.commit(user.user_id, expected, entries, key=key, snapshot=snapshot)
        if version is None:
            self.retried_writes += 1
            return False
        user.memory, user.lines, user.generation = memory, lines, version.generation  # its activator follows
        if snapshot is not None:
            user.snapshot_seq = lines
        return True

    # ------------------------------------------------------------------------------ export, import
    def export(self, user_id: str) -> Iterator[dict[str, Any]]:
        """The user's changes in order (``{"turns", "time"}`` per session, ``{"forget"}`` per forgotten unit):
        what :meth:`import_user` rebuilds the same memory from. The changes stored at the call are read a
        page at a time (later appends are not in it), so a large user streams."""
        with self.hold(user_id) as user:
            upto = user.lines
        return self.store.export(user_id, upto)

    def import_user(self, user_id: str, entries: list[dict[str, Any]]) -> dict[str, Any]:
        """A new user from an export's entries (checked plain sessions and forgets), stored in one
        transaction, so a failure leaves the whole user or nothing. A user that exists is a
        :class:`UserExists` (409); a forget of a unit not there at that point of the history is a 400
        naming the entry."""
        check_user_id(user_id)
        if self.exists(user_id):
            raise UserExists(f"user {user_id!r} exists: delete it first, or import under a new id")
        memory = self._empty_memory(user_id)
        for i, entry in enumerate(entries):
            if "forget" in entry and entry["forget"] not in {u.id for u in memory.store.units}:
                raise UserError(f"entries[{i}]: field 'forget': no memory unit {entry['forget'][:100]!r} at "
                                "that point of the history")
            memory = applyparse_line(self.pipeline, memory, entry)
        changes = [{"forget": e["forget"]} if "forget" in e else {"turns": e["turns"], "time": e.get("time")}
                   for e in entries]
        if not self.store.import_user(user_id, changes, memory.store):
            raise UserExists(f"user {user_id!r} was created while the import ran; delete it first, or "
                             "import under a new id")
        with self._lock:  # a user held from before (an append whose commit lost) is looked up again
            stale = self._users.get(user_id)
        if stale is not None:
            self._drop(stale)
        store = memory.store
        return {"user": user_id, "imported": True, "lines": len(entries), "units": len(store),
                "traces": len(store.traces), "sessions": session_count(store)}

    def filtered(self, user: UserMemory, filters: Any) -> Memory:
        """A memory of the user's units that ``filters`` keep (caller holds the lock): the user's own when
        they keep every unit, else one over a store without the others, their traces regrouped among them."""
        drop = {u.id for u in user.store.units if not filters.keeps(u)}
        return self.pipeline.open_memory(store_without(self.pipeline.builder(), user.store, drop)) if drop \
            else user.memory

    def snapshot_all(self) -> None:
        """Store a snapshot of every user with changes past their snapshot (on shutdown)."""
        for user in list(self._users.values()):
            with user.lock:
                if not user.gone and user.lines > user.snapshot_seq:
                    self.store.save_snapshot(user.user_id, user.generation, user.lines, user.store)
                    user.snapshot_seq = user.lines

    def close(self) -> None:
        """Snapshots brought up to date, then the store's connections closed."""
        try:
            self.snapshot_all()
        finally:
            self.store.close()

    # -------------------------------------------------------------------------------- internals
    def _empty_memory(self, user_id: str) -> Memory:
        from qgmem.data.records import Dialogue

        return self.pipeline.build_memory(Dialogue(id=user_id))

    def _load(self, user_id: str) -> UserMemory | None:
        """The user from their snapshot and the changes after it; ``None`` when there is no such user."""
        loaded = self.store.load(user_id)
        if loaded is None:
            return None
        generation, seq, store, changes = loaded
        memory = self.pipeline.open_memory(store) if store is not None else self._empty_memory(user_id)
        user = UserMemory(user_id, memory, lines=seq, generation=generation, snapshot_seq=seq)
        for entry in changes:
            user.memory = applyparse_line(self.pipeline, user.memory, entry)
            user.lines += 1
        self.replayed_sessions += len(changes)
        if changes and len(changes) >= self.snapshot_every:
            self.store.save_snapshot(user_id, generation, user.lines, user.store)
            user.snapshot_seq = user.lines
        return user
