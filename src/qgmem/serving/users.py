"""Per-user memories on disk: one folder per user, an append journal and checked store snapshots.

A user's folder under the store root (``users/<user id>/``) holds::

    journal.jsonl            one change per line, in order: an appended session or a forgotten unit
                             (the format: qgmem.serving.journal)
    snapshot-<seq:08d>/      a MemoryStore (qgmem.memory.store, checksums in its meta.json) holding
                             the first <seq> lines of the journal applied

An append is made durable before it is acknowledged: the session is applied to a copy of the store in
memory, its journal line is written and ``fsync``-ed, the new store replaces the old one, and a snapshot
is written into a temporary folder and renamed into place (never over an existing folder, so a kill
leaves the previous snapshot whole). On load the newest snapshot that passes the store's integrity
checks is read and the journal lines after it are replayed. Only an incomplete last line (no newline:
a kill while it was being written, so never acknowledged) is dropped, and logged. A complete line that
fails its checksum, the last one included, is an :class:`~qgmem.errors.IntegrityError`: the journal was
edited or damaged after the session was acknowledged, and the user is not served from a guess. So is a
snapshot ahead of the journal (the journal lost acknowledged lines); it is kept, never overwritten.
The lines of a batch are written with one ``write`` and one ``fsync``: a journal that ends inside a batch
(fewer than its ``n`` lines, so never acknowledged) loses that batch's lines at load, as a torn line.

Each user's memory is separate data (its own store, indexes and activator) and the user id is checked
against :data:`USER_ID` before it names a folder: isolation is a filter by construction, not a field
in a shared index.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from qgmem.activation.memory import Memory
from qgmem.data.records import Session, Turn
from qgmem.errors import IntegrityError, UserError
from qgmem.memory.store import MemoryStore, clean_stale_temp
from qgmem.serving.history_file import ASSISTANT_SPEAKERS
from qgmem.serving.journal import (JOURNAL, batch_digest, exported_entries, line_digest, read_journal,
                                   session_digest, truncate_lines, unfinished_batch)

#: what a user id may be: it names a folder, so nothing else (and never "." or "..")
USER_ID = re.compile(r"[A-Za-z0-9_.-]{1,128}")
_SNAPSHOT = re.compile(r"snapshot-(\d{8})$")
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
    """One journal line (or export entry) applied to ``memory``: a session appended, or a unit forgotten
    (a new memory over the store without it: its trace index is rebuilt at the next append, its
    activator at the next question, since extending the old one would keep the unit's rows). Load,
    import and the live calls all go through here, so they give the same memory."""
    if "forget" in entry:
        return pipeline.open_memory(forget_units(pipeline.builder(), memory.store, {entry["forget"]}))
    return memory.appended(pipeline.builder(), [to_session(entry["turns"], entry.get("time"))])


@dataclass
class UserMemory:
    """One user's :class:`~qgmem.activation.memory.Memory` (store, trace index, activator) with what the
    journal keeps beside it, behind one lock."""

    user_id: str
    folder: Path
    memory: Memory
    lines: int = 0  # journal lines applied
    lock: threading.RLock = field(default_factory=threading.RLock)
    snapshot_seq: int = 0  # journal lines the newest snapshot holds
    keys: dict[str, dict[str, Any]] = field(default_factory=dict)  # idempotency key -> (digest, first result)
    last_used: float = field(default_factory=time.monotonic)
    gone: bool = False  # unloaded or deleted: a caller holding this object looks the user up again

    @property
    def store(self) -> MemoryStore:
        return self.memory.store


class UserMemories:
    """The users' memories under ``root`` (``root/users/<id>``), loaded on first use, appended durably."""

    def __init__(self, root: str | Path, pipeline: Any, snapshot_every: int = 1, *, max_loaded_users: int | None = None,
                 max_loaded_units: int | None = None, idle_unload_s: float | None = None):
        if snapshot_every < 1:
            raise UserError(f"snapshot_every must be >= 1, got {snapshot_every}")
        self.max_loaded_users, self.max_loaded_units, self.idle_unload_s = max_loaded_users, max_loaded_units, idle_unload_s
        self.unloaded = 0  # users unloaded (idle or past the budget); reloaded from disk on their next request
        self.root = Path(root)
        self.users_dir = self.root / "users"
        self.users_dir.mkdir(parents=True, exist_ok=True)
        self.deleted_dir = self.root / "deleted"  # users being removed (a kill mid-removal leaves them here)
        self.staging_dir = self.root / "staging"  # users being imported (a kill mid-import leaves them here)
        for leftover in (self.deleted_dir, self.staging_dir):  # never acknowledged: removed
            shutil.rmtree(leftover, ignore_errors=True)
        self.pipeline = pipeline
        self.snapshot_every = snapshot_every
        self._users: dict[str, UserMemory] = {}
        self._lock = threading.Lock()
        self.replayed_sessions = 0  # journal lines replayed at load (sessions after the newest snapshot)
        self.dropped_torn_lines = 0

    # ---------------------------------------------------------------------------------- lookup
    def exists(self, user_id: str) -> bool:
        check_user_id(user_id)
        return user_id in self._users or _on_disk(self.users_dir / user_id)

    def user_ids(self) -> list[str]:
        return sorted(p.name for p in self.users_dir.iterdir() if _on_disk(p))

    def get(self, user_id: str, create: bool = False) -> UserMemory:
        """The user's memory, loaded from disk on first use; :class:`UnknownUser` unless ``create``."""
        check_user_id(user_id)
        with self._lock:
            user = self._users.get(user_id)
            if user is None:
                folder = self.users_dir / user_id
                if _on_disk(folder):  # a snapshot without its journal is refused by the load, never emptied
                    user = self._load(user_id, folder)
                elif create:
                    folder.mkdir(parents=True, exist_ok=True)
                    _fsync_dir(self.users_dir)
                    user = UserMemory(user_id, folder, self._empty_memory(user_id))
                else:
                    raise UnknownUser(f"no memory for user {user_id!r}: append a session first "
                                      f"(POST /v1/users/{user_id}/sessions)")
                self._users[user_id] = user
            user.last_used = time.monotonic()
        self._unload_past_budget(keep=user_id)
        return user

    @contextmanager
    def hold(self, user_id: str, create: bool = False) -> Iterator[UserMemory]:
        """The user's memory with its lock held: what every read and write of one user goes through, so
        a user unloaded (or deleted) between the lookup and the lock is looked up again, never used."""
        while True:
            user = self.get(user_id, create=create)
            with user.lock:
                if user.gone:
                    continue
                user.last_used = time.monotonic()
                yield user
                return

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
        (its lock held) is left loaded. The next request reloads it from its snapshot and journal."""
        if not user.lock.acquire(blocking=False):
            return False
        try:
            if user.gone:
                return False
            if user.lines > user.snapshot_seq:
                self._snapshot(user)
            with self._lock:
                if self._users.get(user.user_id) is user:
                    del self._users[user.user_id]
            user.gone = True
            self.unloaded += 1
            return True
        finally:
            user.lock.release()

    def delete(self, user_id: str) -> bool:
        """Forget a user: unloaded and every file of theirs removed (journal, snapshots, lock files).
        False when there was nothing to delete. (Lock order as everywhere: the user's, then the table's.)

        The folder is first renamed out of ``users/`` (one atomic rename into ``deleted/``), then
        removed: a kill leaves either the whole user or nothing of them under ``users/``, never a
        snapshot without its journal; what is left in ``deleted/`` goes at the next start."""
        check_user_id(user_id)
        folder = self.users_dir / user_id
        with self._lock:
            user = self._users.get(user_id)
        if user is not None:
            user.lock.acquire()
        try:
            with self._lock:  # no request can load the user again while the files go
                current = self._users.pop(user_id, None)  # the one locked, or one loaded since (rare)
                for loaded in {id(u): u for u in (user, current) if u is not None}.values():
                    loaded.gone = True
                if not folder.exists():
                    return user is not None
                aside = self.deleted_dir / f"{user_id}.{uuid.uuid4().hex}"
                self.deleted_dir.mkdir(exist_ok=True)
                folder.rename(aside)
                _fsync_dir(self.users_dir)
                shutil.rmtree(aside)
                return True
        finally:
            if user is not None:
                user.lock.release()

    def loaded(self) -> int:
        return len(self._users)

    def units(self) -> int:
        return sum(len(u.store) for u in list(self._users.values()))

    # ---------------------------------------------------------------------------------- append
    def append(self, user_id: str, turns: list[dict[str, Any]], session_time: str | None = None,
               key: str | None = None) -> dict[str, Any]:
        """Append one session (checked plain turns) to the user's memory; returns once it is durable.

        ``key``: an idempotency key. A session appended before with the same key is not stored again:
        the first append's result is returned (``"replayed": true``); the same key with another
        session is an :class:`IdempotencyConflict`. Keys are kept in the journal, so this holds across
        restarts and unloading."""
        return self.append_batch(user_id, [(turns, session_time)], key, single=True)

    def append_batch(self, user_id: str, sessions: list[tuple[list[dict[str, Any]], str | None]],
                     key: str | None = None, *, single: bool = False) -> dict[str, Any]:
        """Append several sessions ``[(turns, time), …]`` in order, one journal line each, written with one
        ``write`` and one ``fsync``: the reply comes once all are durable, and a kill before that leaves
        none of them (see the module docstring). ``key`` makes the whole batch idempotent, as
        :meth:`append`'s key does one session. ``single``: :meth:`append`'s reply (one session)."""
        digest = session_digest(*sessions[0]) if single else batch_digest(sessions)
        with self.hold(user_id, create=True) as user:
            if key is not None and key in user.keys:
                first = user.keys[key]
                if first["digest"] != digest:
                    raise IdempotencyConflict(f"Idempotency-Key {key!r} was used for another "
                                              f"{'session' if single else 'batch'} of user {user_id!r}; use a new "
                                              "key for new sessions")
                return {**first["result"], "replayed": True}
            t0 = time.perf_counter()
            memory, added = user.memory, []
            for turns, when in sessions:
                entry = {"turns": turns, "time": when}
                grown = applyparse_line(self.pipeline, memory, entry)
                added.append({"session": session_count(memory.store), "units_added": len(grown) - len(memory)})
                memory = grown
            store = memory.store
            t1 = time.perf_counter()
            totals = {"units": len(store), "traces": len(store.traces)}
            result = ({"user": user_id, **added[0], **totals} if single
                      else {"user": user_id, "sessions": added, **totals})
            entries = [{"turns": turns, "time": when} for turns, when in sessions]
            if not single:
                for i, entry in enumerate(entries):
                    entry["batch"] = [i, len(entries)]
            if key is not None:
                entries[-1].update(key=key, result=result, **({} if single else {"request_sha256": digest}))
            self._write_lines(user, entries)
            t2 = time.perf_counter()
            user.memory = memory  # its activator follows at the next question
            user.lines += len(entries)
            if key is not None:  # the key counts from here, the lines being durable: a failed snapshot
                user.keys[key] = {"digest": digest, "result": result}  # after this replays them
            self._maybe_snapshot(user)
            t3 = time.perf_counter()
            result = {**result, "seconds": {"construction": t1 - t0, "journal": t2 - t1, "snapshot": t3 - t2,
                                            "total": t3 - t0}}
            if key is not None:
                user.keys[key]["result"] = result
            return result

    def forget(self, user_id: str, unit_id: str) -> dict[str, Any]:
        """Forget one memory unit: journaled (a restart does not bring it back), then removed from the store
        with the traces regrouped over the units left, so no answer, search, trace or graph holds it again.
        A unit that is not there (never, or forgotten before) is an :class:`UnknownUnit` (404)."""
        with self.hold(user_id) as user:
            if unit_id not in {u.id for u in user.store.units}:
                raise UnknownUnit(f"user {user_id!r} has no memory unit {unit_id[:100]!r} (never stored, or "
                                  "forgotten already)")
            memory = applyparse_line(self.pipeline, user.memory, {"forget": unit_id})
            self._write_lines(user, [{"forget": unit_id}])
            user.memory, store = memory, memory.store  # a new memory: nothing of the old activator is kept
            user.lines += 1
            self._maybe_snapshot(user)
            return {"user": user_id, "unit_id": unit_id, "forgotten": True, "units": len(store),
                    "traces": len(store.traces)}

    # ------------------------------------------------------------------------------ export, import
    def export(self, user_id: str) -> Iterator[dict[str, Any]]:
        """The user's changes in order (``{"turns", "time"}`` per session, ``{"forget"}`` per forgotten unit):
        what :meth:`import_user` rebuilds the same memory from. The journal is read as it was at the call
        (later appends are not in it) and line by line, each line checked, so a large user streams."""
        with self.hold(user_id) as user:
            path = user.folder / JOURNAL
            if not path.exists():  # created, but its first append failed
                return iter(())
            handle = open(path, "rb")  # stays readable through a delete that follows
            size = path.stat().st_size
        return exported_entries(handle, size, path)

    def import_user(self, user_id: str, entries: list[dict[str, Any]]) -> dict[str, Any]:
        """A new user from an export's entries (checked plain sessions and forgets): built in
        ``staging/`` (journal, then snapshot), then renamed into ``users/`` at once, so a kill leaves the
        whole user or nothing. A user that exists is a :class:`UserExists` (409); a forget of a unit not
        there at that point of the history is a 400 naming the entry."""
        check_user_id(user_id)
        if self.exists(user_id):
            raise UserExists(f"user {user_id!r} exists: delete it first, or import under a new id")
        self.staging_dir.mkdir(exist_ok=True)
        folder = self.staging_dir / f"{user_id}.{uuid.uuid4().hex}"
        folder.mkdir()
        try:
            user = UserMemory(user_id, folder, self._empty_memory(user_id))
            for i, entry in enumerate(entries):
                if "forget" in entry and entry["forget"] not in {u.id for u in user.store.units}:
                    raise UserError(f"entries[{i}]: field 'forget': no memory unit {entry['forget'][:100]!r} at "
                                    "that point of the history")
                user.memory = applyparse_line(self.pipeline, user.memory, entry)
            self._write_lines(user, entries)
            user.lines = len(entries)
            if user.lines:
                self._snapshot(user)
            final = self.users_dir / user_id
            with self._lock:
                if user_id in self._users or _on_disk(final):
                    raise UserExists(f"user {user_id!r} was created while the import ran; delete it first, or "
                                     "import under a new id")
                if final.is_dir():  # an empty folder a failed first append left
                    final.rmdir()
                folder.rename(final)
                _fsync_dir(self.users_dir)
        finally:
            shutil.rmtree(folder, ignore_errors=True)
        return {"user": user_id, "imported": True, "lines": len(entries), "units": len(user.store),
                "traces": len(user.store.traces), "sessions": session_count(user.store)}

    def filtered(self, user: UserMemory, filters: Any) -> Memory:
        """A memory of the user's units that ``filters`` keep (caller holds the lock): the user's own when
        they keep every unit, else one over a store without the others, their traces regrouped among them."""
        drop = {u.id for u in user.store.units if not filters.keeps(u)}
        return self.pipeline.open_memory(store_without(self.pipeline.builder(), user.store, drop)) if drop \
            else user.memory

    def snapshot_all(self) -> None:
        """Write a snapshot of every user with journal lines past their snapshot (on shutdown)."""
        for user in list(self._users.values()):
            with user.lock:
                if user.lines > user.snapshot_seq:
                    self._snapshot(user)

    # -------------------------------------------------------------------------------- internals
    def _empty_memory(self, user_id: str) -> Memory:
        from qgmem.data.records import Dialogue

        return self.pipeline.build_memory(Dialogue(id=user_id))

    def _write_lines(self, user: UserMemory, entries: list[dict[str, Any]]) -> None:
        """Append ``entries`` as the journal's next lines with one ``write``, then ``fsync`` (and the folder's
        when the journal is new): they are durable, all of them, when this returns."""
        text = ""
        for seq, entry in enumerate(entries, start=user.lines):
            line = {"seq": seq, **entry}
            text += json.dumps({**line, "sha256": line_digest(line)}, ensure_ascii=False) + "\n"
        journal = user.folder / JOURNAL
        new_file = not journal.exists()
        with open(journal, "ab") as f:
            start = f.tell()
            try:
                f.write(text.encode("utf-8"))
                f.flush()
                os.fsync(f.fileno())
            except OSError:  # a full disk may have taken part of the lines: cut back, nothing was acknowledged
                f.truncate(start)
                raise
        if new_file:
            _fsync_dir(user.folder)

    def _maybe_snapshot(self, user: UserMemory) -> None:
        if user.lines - user.snapshot_seq >= self.snapshot_every:
            self._snapshot(user)

    def _snapshot(self, user: UserMemory) -> None:
        user.store.meta["journal_seq"] = user.lines
        final = user.folder / f"snapshot-{user.lines:08d}"
        if final.exists():  # written by an earlier process for the same sessions: same content
            shutil.rmtree(final)
        user.store.save(final)
        _remove_lock_file(final)  # one process writes a user's folder (see docs/serving.md): no lock is left
        _fsync_dir(user.folder)
        user.snapshot_seq = user.lines
        for old in user.folder.iterdir():
            m = _SNAPSHOT.match(old.name)
            if m and int(m.group(1)) < user.lines:
                shutil.rmtree(old, ignore_errors=True)
                _remove_lock_file(old)

    def _load(self, user_id: str, folder: Path) -> UserMemory:
        clean_stale_temp(folder)
        snapshots = sorted((int(m.group(1)), p) for p in folder.iterdir() if (m := _SNAPSHOT.match(p.name)))
        if not (folder / JOURNAL).is_file():
            raise IntegrityError(f"{snapshots[-1][1]} is there but {folder / JOURNAL} is missing: the journal that "
                                 "holds the user's acknowledged sessions was lost (removed by hand, or a kill inside "
                                 "the delete of an older server); the user is not served until an operator restores "
                                 "the journal or deletes the user")
        entries = read_journal(folder / JOURNAL)
        whole = len(entries) - (1 if entries and entries[-1] is None else 0)
        ahead = [(n, p) for n, p in snapshots if n > whole]
        if ahead:  # the journal is synced before any snapshot: it lost acknowledged lines. Keep both as they are
            raise IntegrityError(f"{ahead[-1][1]} holds {ahead[-1][0]} sessions "
                                 f"but {folder / JOURNAL} only {whole}: the journal lost acknowledged sessions "
                                 "(cut or restored from an older copy); the user is not served until an operator "
                                 "restores it")
        if entries and entries[-1] is None:  # a torn last line: never acknowledged, dropped
            entries.pop()
            truncate_lines(folder / JOURNAL, len(entries))
            self.dropped_torn_lines += 1
            log.warning("user %s: dropped the incomplete last journal line (a write cut by a kill, never "
                        "acknowledged)", user_id)
        unfinished = unfinished_batch(entries, folder / JOURNAL)
        if unfinished:  # the first lines of a batch whose write was cut: never acknowledged, dropped
            del entries[-unfinished:]
            truncate_lines(folder / JOURNAL, len(entries))
            self.dropped_torn_lines += unfinished
            log.warning("user %s: dropped %d journal lines of a batch append cut by a kill (never acknowledged)",
                        user_id, unfinished)
        store, seq = None, 0
        for n, path in reversed(snapshots):
            try:
                candidate = MemoryStore.load(path)
            except (UserError, ValueError, OSError):
                continue  # damaged: an older snapshot and the journal rebuild it
            finally:
                _remove_lock_file(path)  # the load's lock (one process serves a store root)
            if candidate.meta.get("journal_seq") == n and candidate.dialogue_id == user_id:
                store, seq = candidate, n
                break
        user = UserMemory(user_id, folder, self.pipeline.open_memory(store) if store is not None
                          else self._empty_memory(user_id),
                          lines=seq, snapshot_seq=seq if store is not None else 0)
        for entry in entries:
            if isinstance(entry.get("key"), str) and isinstance(entry.get("result"), dict):
                digest = entry.get("request_sha256") or session_digest(entry["turns"], entry.get("time"))
                user.keys[entry["key"]] = {"digest": digest, "result": entry["result"]}
        for entry in entries[seq:]:
            user.memory = applyparse_line(self.pipeline, user.memory, entry)
            user.lines += 1
            self.replayed_sessions += 1
        if user.lines > user.snapshot_seq:
            self._snapshot(user)
        return user


def _on_disk(folder: Path) -> bool:
    """A user's folder holds their memory: a journal, or a snapshot (whose journal was lost: refused on load)."""
    return (folder / JOURNAL).is_file() or (folder.is_dir() and any(_SNAPSHOT.match(p.name) for p in folder.iterdir()))


def _remove_lock_file(store_dir: Path) -> None:
    """The ``.<name>.lock`` file :func:`qgmem.memory.store.store_lock` leaves beside a store folder."""
    try:
        (store_dir.parent / f".{store_dir.name}.lock").unlink()
    except FileNotFoundError:
        pass


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
