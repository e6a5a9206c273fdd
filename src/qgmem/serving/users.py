"""Per-user memories on disk: one folder per user, an append journal and checked store snapshots.

A user's folder under the store root (``users/<user id>/``) holds::

    journal.jsonl            one appended session per line: {"seq", "turns", "time", "sha256"}
    snapshot-<seq:08d>/      a MemoryStore (qgmem.memory.store, checksums in its meta.json) holding
                             the first <seq> sessions of the journal

An append is made durable before it is acknowledged: the session is applied to a copy of the store in
memory, its journal line is written and ``fsync``-ed, the new store replaces the old one, and a snapshot
is written into a temporary folder and renamed into place (never over an existing folder, so a kill
leaves the previous snapshot whole). On load the newest snapshot that passes the store's integrity
checks is read and the journal lines after it are replayed. Only an incomplete last line (no newline:
a kill while it was being written, so never acknowledged) is dropped, and logged. A complete line that
fails its checksum, the last one included, is an :class:`~qgmem.errors.IntegrityError`: the journal was
edited or damaged after the session was acknowledged, and the user is not served from a guess. So is a
snapshot ahead of the journal (the journal lost acknowledged lines); it is kept, never overwritten.

Each user's memory is separate data (its own store, indexes and activator) and the user id is checked
against :data:`USER_ID` before it names a folder: isolation is a filter by construction, not a field
in a shared index.
"""

from __future__ import annotations

import hashlib
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

#: what a user id may be: it names a folder, so nothing else (and never "." or "..")
USER_ID = re.compile(r"[A-Za-z0-9_.-]{1,128}")
JOURNAL = "journal.jsonl"
_SNAPSHOT = re.compile(r"snapshot-(\d{8})$")
log = logging.getLogger("qgmem.serve")


class BadUserId(UserError, ValueError):
    """A user id outside ``[A-Za-z0-9_.-]{1,128}`` (or a bare ``.``/``..``)."""


class UnknownUser(UserError, LookupError):
    """No memory for this user (nothing was ever appended)."""


class IdempotencyConflict(UserError):
    """An idempotency key reused for another session."""


def check_user_id(user_id: str) -> str:
    if not isinstance(user_id, str) or not USER_ID.fullmatch(user_id) or user_id in (".", ".."):
        raise BadUserId(f"user id {str(user_id)[:40]!r} must match [A-Za-z0-9_.-]{{1,128}} (and not be '.' or '..')")
    return user_id


def session_digest(turns: list[dict[str, Any]], session_time: str | None, **extra: Any) -> str:
    """The checksum of one journal line's content: the session, plus its idempotency ``key`` and first
    ``result`` when the line has them (lines without them keep the digest they always had)."""
    canonical = json.dumps({"turns": turns, "time": session_time, **{k: v for k, v in extra.items() if v is not None}},
                           sort_keys=True, ensure_ascii=False)
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()


def to_session(turns: list[dict[str, Any]], session_time: str | None = None) -> Session:
    """A :class:`Session` of checked plain turns (ids and indices are given when it is appended)."""
    out = []
    for i, t in enumerate(turns):
        role = "assistant" if t["speaker"].strip().lower() in ASSISTANT_SPEAKERS else "user"
        out.append(Turn(id=str(i), session_id="new", speaker=t["speaker"], role=role, text=t["text"],
                        time=t.get("time") or session_time))
    return Session(id="new", turns=out, time=session_time)


@dataclass
class UserMemory:
    """One user's :class:`~qgmem.activation.memory.Memory` (store, trace index, activator) with what the
    journal keeps beside it, behind one lock."""

    user_id: str
    folder: Path
    memory: Memory
    sessions: int = 0  # journal lines applied
    lock: threading.RLock = field(default_factory=threading.RLock)
    snapshot_seq: int = 0
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
        shutil.rmtree(self.deleted_dir, ignore_errors=True)
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
            if user.sessions > user.snapshot_seq:
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
        with self.hold(user_id, create=True) as user:
            if key is not None and key in user.keys:
                first = user.keys[key]
                if first["digest"] != session_digest(turns, session_time):
                    raise IdempotencyConflict(f"Idempotency-Key {key!r} was used for another session of user "
                                              f"{user_id!r}; use a new key for a new session")
                return {**first["result"], "replayed": True}
            t0 = time.perf_counter()
            memory = user.memory.appended(self.pipeline.builder(), [to_session(turns, session_time)])
            t1 = time.perf_counter()
            store = memory.store
            added = len(store) - len(user.store)
            result = {"user": user_id, "session": user.sessions, "units_added": added, "units": len(store),
                      "traces": len(store.traces)}
            entry = {"seq": user.sessions, "turns": turns, "time": session_time}
            if key is not None:
                entry.update(key=key, result=result)
            line = json.dumps({**entry, "sha256": session_digest(turns, session_time, key=key,
                                                                 result=result if key is not None else None)},
                              ensure_ascii=False)
            journal = user.folder / JOURNAL
            new_file = not journal.exists()
            with open(journal, "a", encoding="utf-8") as f:
                f.write(line + "\n")
                f.flush()
                os.fsync(f.fileno())
            if new_file:
                _fsync_dir(user.folder)
            t2 = time.perf_counter()
            user.memory = memory  # its activator follows at the next question
            user.sessions += 1
            if key is not None:  # the key counts from here, the line being durable: a failed snapshot
                user.keys[key] = {"digest": session_digest(turns, session_time), "result": result}  # replays it
            if user.sessions - user.snapshot_seq >= self.snapshot_every:
                self._snapshot(user)
            t3 = time.perf_counter()
            result = {**result, "seconds": {"construction": t1 - t0, "journal": t2 - t1, "snapshot": t3 - t2,
                                            "total": t3 - t0}}
            if key is not None:
                user.keys[key] = {"digest": session_digest(turns, session_time), "result": result}
            return result

    def snapshot_all(self) -> None:
        """Write a snapshot of every user with journal lines past their snapshot (on shutdown)."""
        for user in list(self._users.values()):
            with user.lock:
                if user.sessions > user.snapshot_seq:
                    self._snapshot(user)

    # -------------------------------------------------------------------------------- internals
    def _empty_memory(self, user_id: str) -> Memory:
        from qgmem.data.records import Dialogue

        return self.pipeline.build_memory(Dialogue(id=user_id))

    def _snapshot(self, user: UserMemory) -> None:
        user.store.meta["journal_seq"] = user.sessions
        final = user.folder / f"snapshot-{user.sessions:08d}"
        if final.exists():  # written by an earlier process for the same sessions: same content
            shutil.rmtree(final)
        user.store.save(final)
        _remove_lock_file(final)  # one process writes a user's folder (see docs/serving.md): no lock is left
        _fsync_dir(user.folder)
        user.snapshot_seq = user.sessions
        for old in user.folder.iterdir():
            m = _SNAPSHOT.match(old.name)
            if m and int(m.group(1)) < user.sessions:
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
            _truncate_last_line(folder / JOURNAL)
            self.dropped_torn_lines += 1
            log.warning("user %s: dropped the incomplete last journal line (a write cut by a kill, never "
                        "acknowledged)", user_id)
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
                          else self._empty_memory(user_id), sessions=seq, snapshot_seq=seq if store is not None else 0)
        builder = self.pipeline.builder()
        for entry in entries:
            if isinstance(entry.get("key"), str) and isinstance(entry.get("result"), dict):
                user.keys[entry["key"]] = {"digest": session_digest(entry["turns"], entry.get("time")),
                                           "result": entry["result"]}
        for entry in entries[seq:]:
            user.memory = user.memory.appended(builder, [to_session(entry["turns"], entry.get("time"))])
            user.sessions += 1
            self.replayed_sessions += 1
        if user.sessions > user.snapshot_seq:
            self._snapshot(user)
        return user


def _on_disk(folder: Path) -> bool:
    """A user's folder holds their memory: a journal, or a snapshot (whose journal was lost: refused on load)."""
    return (folder / JOURNAL).is_file() or (folder.is_dir() and any(_SNAPSHOT.match(p.name) for p in folder.iterdir()))


def read_journal(path: Path) -> list[dict[str, Any] | None]:
    """The journal's sessions in order; the last entry is ``None`` when the file ends in a torn line.

    A line is written with one ``write(line + "\\n")`` (JSON escapes newlines in the text), so a kill
    can only leave an incomplete last line without its newline: that one is dropped. A complete line
    that fails its checksum (wherever it is, the last included) was damaged or edited after it was
    acknowledged: an :class:`~qgmem.errors.IntegrityError` naming the line, never a silent cut.
    """
    raw = path.read_bytes()
    lines = raw.split(b"\n")
    complete, tail = lines[:-1], lines[-1]
    out: list[dict[str, Any] | None] = []
    for number, line in enumerate(complete, start=1):
        entry = _entry(line)
        if entry is None or entry["seq"] != len(out):
            raise IntegrityError(f"{path}, line {number}: not a whole journal entry (seq {len(out)} expected); "
                                 "the journal was damaged or edited after the session was acknowledged")
        out.append(entry)
    if tail:  # no newline: the write was cut by a kill before it was acknowledged
        out.append(None)
    return out


def _entry(line: bytes) -> dict[str, Any] | None:
    try:
        entry = json.loads(line.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError):
        return None
    if not isinstance(entry, dict) or not isinstance(entry.get("turns"), list) or not isinstance(entry.get("seq"), int):
        return None
    if entry.get("sha256") != session_digest(entry["turns"], entry.get("time"), key=entry.get("key"),
                                             result=entry.get("result")):
        return None
    return entry


def _truncate_last_line(path: Path) -> None:
    raw = path.read_bytes()
    body = raw[:-1] if raw.endswith(b"\n") else raw
    cut = body.rfind(b"\n")
    with open(path, "r+b") as f:
        f.truncate(cut + 1 if cut >= 0 else 0)
        f.flush()
        os.fsync(f.fileno())


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
