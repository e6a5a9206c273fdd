"""A replayable response cache in SQLite, so reruns cost no LLM calls and killed builds resume.

The key is a SHA-256 over (backend name, model id, messages, max_new_tokens, temperature): exactly what
determines a temperature-0 reply. Failed requests and empty replies are never stored. A reply that the
caller's ``validate`` rejected (``chat(..., validate=...)``) is stored *marked rejected* when it was asked
at temperature 0, because the same request would get the same reply: a rebuild replays it (and the
caller rejects it again, exactly as the first time) instead of paying for it twice. At a higher
temperature a rejected reply is not stored, so it is asked again. ``--refresh-llm-cache rejected`` drops
the rejected replies (after a change of server or sampling, say) so they are asked again. A stored
*accepted* reply that fails the caller's check on replay (written by an older version, say) is deleted
and asked again; a stored rejected reply that the caller's check now accepts is used.

Misses are sent to the inner backend in chunks and each chunk is committed before the next starts; a
build killed midway therefore keeps everything it had paid for. Threads that share one cache ask a
request once: one that another thread is asking right now waits for that reply instead. :meth:`CachedBackend.drop` (the
``--refresh-llm-cache`` flag) deletes a chosen range of entries so they are asked again.
"""

from __future__ import annotations

import hashlib
import json
import re
import sqlite3
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path

from qgmem.errors import UserError
from qgmem.llm.base import ChatResult, Conversation, LLMBackend, Validator, check_reply, reply_problem

_SCHEMA = """
CREATE TABLE IF NOT EXISTS responses (
    key TEXT PRIMARY KEY,
    backend TEXT NOT NULL,
    model TEXT NOT NULL,
    text TEXT NOT NULL,
    prompt_tokens INTEGER NOT NULL,
    completion_tokens INTEGER NOT NULL
)
"""
_HEX = re.compile(r"^[0-9a-f]{1,64}$")


def cache_key(backend: str, model: str, messages: Conversation, max_new_tokens: int, temperature: float) -> str:
    payload = json.dumps(
        {"backend": backend, "model": model, "messages": messages, "max_new_tokens": int(max_new_tokens),
         "temperature": float(temperature)},
        sort_keys=True, ensure_ascii=False, separators=(",", ":"),
    )
    return hashlib.sha256(payload.encode("utf-8")).hexdigest()


@dataclass(frozen=True)
class KeyRange:
    """Which cache entries to drop: all of them, keys in ``[start, end)``, one model's, or those stored
    since a time. Parsed from the ``--refresh-llm-cache`` value by :meth:`parse`."""

    start: str | None = None
    end: str | None = None
    model: str | None = None
    since: float | None = None
    rejected: bool = False  # only the replies stored as rejected by the caller's check

    @classmethod
    def parse(cls, spec: str) -> KeyRange:
        """``all`` | ``rejected`` | ``PREFIX`` (hex) | ``START..END`` (hex, end exclusive, either may be
        empty) | ``model=NAME`` | ``since=UNIX_SECONDS``."""
        spec = spec.strip().lower() if not spec.strip().startswith("model=") else spec.strip()
        if spec == "all":
            return cls()
        if spec == "rejected":
            return cls(rejected=True)
        if spec.startswith("model="):
            return cls(model=spec.split("=", 1)[1])
        if spec.startswith("since="):
            try:
                return cls(since=float(spec.split("=", 1)[1]))
            except ValueError:
                raise UserError(f"--refresh-llm-cache {spec!r}: since= takes Unix seconds") from None
        if ".." in spec:
            start, end = spec.split("..", 1)
            for part in (start, end):
                if part and not _HEX.match(part):
                    raise UserError(f"--refresh-llm-cache {spec!r}: {part!r} is not a hex key prefix")
            if start and end and start >= end:
                raise UserError(f"--refresh-llm-cache {spec!r}: the range is empty (start >= end)")
            return cls(start=start or None, end=end or None)
        if _HEX.match(spec):
            return cls.prefix(spec)
        raise UserError(f"--refresh-llm-cache {spec!r}: expected all, rejected, a hex key prefix, START..END, "
                        "model=NAME or since=UNIX_SECONDS")

    @classmethod
    def prefix(cls, prefix: str) -> KeyRange:
        """Every key that starts with ``prefix``: the range ``[prefix, prefix + 1)``."""
        if prefix.strip("f") == "":
            return cls(start=prefix)
        head = prefix.rstrip("f")
        end = head[:-1] + format(int(head[-1], 16) + 1, "x")
        return cls(start=prefix, end=end)

    def where(self) -> tuple[str, list]:
        clauses, params = [], []
        if self.start is not None:
            clauses.append("key >= ?")
            params.append(self.start)
        if self.end is not None:
            clauses.append("key < ?")
            params.append(self.end)
        if self.model is not None:
            clauses.append("model = ?")
            params.append(self.model)
        if self.since is not None:
            clauses.append("created >= ?")
            params.append(self.since)
        if self.rejected:
            clauses.append("rejected = 1")
        return (" WHERE " + " AND ".join(clauses)) if clauses else "", params


def _kept(result: ChatResult, temperature: float) -> bool:
    """Whether ``result`` is stored (and so replayed): a usable reply, or at temperature 0 a non-empty one
    the caller rejected (the model would give it again). The one rule for storing and for waiting threads."""
    if reply_problem(result.text) is not None:
        return False
    return result.error is None or (result.unusable and temperature == 0)


@dataclass
class _Asking:
    """One :meth:`CachedBackend.chat` call's requests and the results being filled in."""

    conversations: list[Conversation]
    validate: list[Validator | None]
    results: list[ChatResult | None]
    params: dict

    def fill(self, idx: list[int], answer: ChatResult, first_is_copy: bool = False) -> None:
        """``answer`` for every position of one key; all but the first (or all) as replays of it."""
        for n, i in enumerate(idx):
            copy = first_is_copy or n > 0
            self.results[i] = answer if not copy else ChatResult(
                answer.text, answer.prompt_tokens, answer.completion_tokens, cached=True, error=answer.error,
                unusable=answer.unusable)


class CachedBackend(LLMBackend):
    """Wraps another backend; identical requests are answered from ``path`` with ``cached=True``.

    ``usage.calls`` counts requests that reached the inner backend, ``usage.cache_hits`` the replays;
    ``dropped`` counts stored replies deleted because they failed the caller's check on replay.
    """

    def __init__(self, inner: LLMBackend, path: str | Path, chunk_size: int | None = None):
        super().__init__(inner.model_id)
        self.inner = inner
        self.name = inner.name
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.chunk_size = chunk_size or max(1, int(getattr(inner, "chunk_size", 8)))
        self.dropped = 0
        self.concurrent_callers = inner.concurrent_callers
        self._db_lock = threading.Lock()
        self._inflight: dict[str, Future] = {}  # keys being asked right now, by any thread
        self._inflight_lock = threading.Lock()
        try:
            self._db = sqlite3.connect(str(self.path), check_same_thread=False)
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute(_SCHEMA)
            columns = {row[1] for row in self._db.execute("PRAGMA table_info(responses)")}
            if "created" not in columns:  # caches written before entries were timed
                self._db.execute("ALTER TABLE responses ADD COLUMN created REAL NOT NULL DEFAULT 0")
            if "rejected" not in columns:  # caches written before rejected replies were kept
                self._db.execute("ALTER TABLE responses ADD COLUMN rejected INTEGER NOT NULL DEFAULT 0")
            self._db.commit()
        except sqlite3.DatabaseError as exc:
            raise UserError(f"{self.path}: not a usable LLM response cache ({exc})",
                            hint="delete the file or pass another --llm-cache") from None

    def __len__(self) -> int:
        with self._db_lock:
            return int(self._db.execute("SELECT COUNT(*) FROM responses").fetchone()[0])

    def drop(self, keys: KeyRange | str) -> int:
        """Delete the entries in ``keys`` (a :class:`KeyRange` or its ``--refresh-llm-cache`` spelling)."""
        keys = KeyRange.parse(keys) if isinstance(keys, str) else keys
        where, params = keys.where()
        with self._db_lock:
            removed = self._db.execute(f"DELETE FROM responses{where}", params).rowcount
            self._db.commit()
        return int(removed)

    def _lookup(self, key: str) -> tuple[ChatResult, bool] | None:
        """The stored reply of ``key`` and whether it was stored as rejected, or ``None``."""
        with self._db_lock:
            row = self._db.execute(
                "SELECT text, prompt_tokens, completion_tokens, rejected FROM responses WHERE key = ?", (key,)
            ).fetchone()
        return None if row is None else (ChatResult(row[0], int(row[1]), int(row[2]), cached=True), bool(row[3]))

    def _replay(self, key: str, check: Validator | None, temperature: float) -> ChatResult | None:
        """What the cache answers for ``key`` (checked with ``check``), or ``None``: ask the model.

        A stored accepted reply that ``check`` now rejects was stored by an older version: it is deleted
        and asked again. A stored rejected reply is replayed, rejected again, at temperature 0 (the model
        would give it again); at another temperature it is asked again.
        """
        found = self._lookup(key)
        if found is None:
            return None
        hit, rejected = found
        answer = check_reply(hit, check)
        if answer.error is None:
            return answer
        if rejected and temperature == 0:
            return answer
        self._forget(key)
        self.dropped += int(not rejected)
        return None

    def _forget(self, key: str) -> None:
        with self._db_lock:
            self._db.execute("DELETE FROM responses WHERE key = ?", (key,))
            self._db.commit()

    def _store(self, items: list[tuple[str, ChatResult]], temperature: float) -> None:
        """Store the usable replies, and at temperature 0 the non-empty ones the caller rejected."""
        now = time.time()
        rows = [(k, self.inner.name, self.inner.model_id, r.text, r.prompt_tokens, r.completion_tokens, now,
                 int(r.error is not None))
                for k, r in items if _kept(r, temperature)]
        if not rows:
            return
        with self._db_lock:
            self._db.executemany("INSERT OR REPLACE INTO responses (key, backend, model, text, prompt_tokens, "
                                 "completion_tokens, created, rejected) VALUES (?, ?, ?, ?, ?, ?, ?, ?)", rows)
            self._db.commit()

    def _chat_checked(self, conversations: list[Conversation], *, max_new_tokens: int, temperature: float,
                      validate: list[Validator | None]) -> list[ChatResult]:
        keys = [cache_key(self.inner.name, self.inner.model_id, c, max_new_tokens, temperature)
                for c in conversations]
        results: list[ChatResult | None] = [self._replay(key, check, temperature)
                                            for key, check in zip(keys, validate)]
        # Identical requests inside one batch are asked once.
        pending: dict[str, list[int]] = {}
        for i, r in enumerate(results):
            if r is None:
                pending.setdefault(keys[i], []).append(i)
        ask = _Asking(conversations, validate, results, {"max_new_tokens": max_new_tokens, "temperature": temperature})
        todo = list(pending.items())
        for second_round in (False, True):
            owned, borrowed, found = self._claim(todo, validate, temperature, force=second_round)
            for idx, hit in found:
                ask.fill(idx, hit, first_is_copy=True)
            self._ask(ask, owned)
            todo = []
            for key, idx, future in borrowed:
                answer = future.result()
                answer = None if answer is None else check_reply(
                    ChatResult(answer.text, answer.prompt_tokens, answer.completion_tokens, cached=True,
                               error=answer.error, unusable=answer.unusable, unavailable=answer.unavailable),
                    validate[idx[0]])
                if answer is None or not _kept(answer, temperature):
                    todo.append((key, idx))  # it failed for the thread that asked: ask it here, as a serial run would
                else:
                    ask.fill(idx, answer, first_is_copy=True)
            if not todo:
                break
        with self._lock:
            self.usage.retries = self.inner.usage.retries
        return [r for r in results if r is not None]

    def _claim(self, todo: list[tuple[str, list[int]]], validate: list[Validator | None], temperature: float,
               force: bool):
        """Split ``todo`` into the requests this thread asks, those another thread is asking right now,
        and those another thread stored since this one looked them up.

        Threads sharing this backend (cases replayed side by side) often send the same prompt (cases of
        one persona share their distractor conversations): it is asked once and the others wait for its
        reply, as they would have found it stored had the cases run one after another. With ``force``
        everything is asked here (a reply waited for failed); a key nobody else is asking is still
        registered so that others can wait for it. An owner stores its reply before it stops being in
        flight, so a key neither in flight nor stored (looked up under the same lock) is not answered.
        """
        owned: list[tuple[str, list[int], Future | None]] = []
        borrowed: list[tuple[str, list[int], Future]] = []
        found: list[tuple[list[int], ChatResult]] = []
        with self._inflight_lock:
            for key, idx in todo:
                other = self._inflight.get(key)
                if other is not None and not force:
                    borrowed.append((key, idx, other))
                    continue
                if other is None and not force:
                    hit = self._replay(key, validate[idx[0]], temperature)
                    if hit is not None:
                        found.append((idx, hit))
                        continue
                mine = None
                if other is None:
                    mine = self._inflight[key] = Future()
                owned.append((key, idx, mine))
        return owned, borrowed, found

    def _settle(self, key: str, future: Future | None, answer: ChatResult | None) -> None:
        """Hand ``answer`` (``None``: not asked, after an exception) to the threads waiting for ``key``."""
        if future is None:
            return
        with self._inflight_lock:
            if self._inflight.get(key) is future:
                del self._inflight[key]
        if not future.done():
            future.set_result(answer)

    def _ask(self, ask: "_Asking", owned: list[tuple[str, list[int], Future | None]]) -> None:
        """Send ``owned`` to the inner backend in chunks, each committed before the next starts."""
        try:
            for start in range(0, len(owned), self.chunk_size):
                chunk = owned[start:start + self.chunk_size]
                checks = [ask.validate[idx[0]] for _, idx, _ in chunk]
                answers = self.inner.chat([ask.conversations[idx[0]] for _, idx, _ in chunk], **ask.params,
                                          validate=checks)
                answers = [check_reply(a, v) for a, v in zip(answers, checks)]  # an inner backend that skips it
                self._store([(key, a) for (key, _, _), a in zip(chunk, answers)], ask.params["temperature"])
                for (key, idx, future), answer in zip(chunk, answers):
                    ask.fill(idx, answer)
                    self._settle(key, future, answer)
        finally:  # an exception midway: whoever waits for the rest asks them itself
            for key, _, future in owned:
                self._settle(key, future, None)

    def _chat(self, conversations: list[Conversation], *, max_new_tokens: int,
              temperature: float) -> list[ChatResult]:
        return self._chat_checked(conversations, max_new_tokens=max_new_tokens, temperature=temperature,
                                  validate=[None] * len(conversations))

    def close(self) -> None:
        with self._db_lock:
            self._db.close()
        self.inner.close()
