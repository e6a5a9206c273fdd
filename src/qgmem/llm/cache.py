"""A replayable response cache in SQLite, so reruns cost no LLM calls and killed builds resume.

The key is a SHA-256 over (backend name, model id, messages, max_new_tokens, temperature): exactly what
determines a temperature-0 reply. Only successful replies are stored, so a request that failed is
asked again next time. Misses are sent to the inner backend in chunks and each chunk is committed
before the next starts; a build killed midway therefore keeps everything it had paid for.
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
import threading
from pathlib import Path

from qgmem.llm.base import ChatResult, Conversation, LLMBackend

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


def cache_key(backend: str, model: str, messages: Conversation, max_new_tokens: int, temperature: float) -> str:
    payload = json.dumps(
        {"backend": backend, "model": model, "messages": messages, "max_new_tokens": int(max_new_tokens),
         "temperature": float(temperature)},
        sort_keys=True, ensure_ascii=False, separators=(",", ":"),
    )
    return hashlib.sha256(payload.encode("utf-8")).hexdigest()


class CachedBackend(LLMBackend):
    """Wraps another backend; identical requests are answered from ``path`` with ``cached=True``.

    ``usage.calls`` counts requests that reached the inner backend, ``usage.cache_hits`` the replays.
    """

    def __init__(self, inner: LLMBackend, path: str | Path, chunk_size: int | None = None):
        super().__init__(inner.model_id)
        self.inner = inner
        self.name = inner.name
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.chunk_size = chunk_size or max(1, int(getattr(inner, "chunk_size", 8)))
        self._db_lock = threading.Lock()
        self._db = sqlite3.connect(str(self.path), check_same_thread=False)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute(_SCHEMA)
        self._db.commit()

    def __len__(self) -> int:
        with self._db_lock:
            return int(self._db.execute("SELECT COUNT(*) FROM responses").fetchone()[0])

    def _lookup(self, key: str) -> ChatResult | None:
        with self._db_lock:
            row = self._db.execute(
                "SELECT text, prompt_tokens, completion_tokens FROM responses WHERE key = ?", (key,)
            ).fetchone()
        return None if row is None else ChatResult(row[0], int(row[1]), int(row[2]), cached=True)

    def _store(self, items: list[tuple[str, ChatResult]]) -> None:
        rows = [(k, self.inner.name, self.inner.model_id, r.text, r.prompt_tokens, r.completion_tokens)
                for k, r in items if r.error is None]
        if not rows:
            return
        with self._db_lock:
            self._db.executemany("INSERT OR REPLACE INTO responses VALUES (?, ?, ?, ?, ?, ?)", rows)
            self._db.commit()

    def _chat(self, conversations: list[Conversation], *, max_new_tokens: int,
              temperature: float) -> list[ChatResult]:
        keys = [cache_key(self.inner.name, self.inner.model_id, c, max_new_tokens, temperature)
                for c in conversations]
        results: list[ChatResult | None] = [self._lookup(k) for k in keys]
        # Identical requests inside one batch are asked once.
        pending: dict[str, list[int]] = {}
        for i, r in enumerate(results):
            if r is None:
                pending.setdefault(keys[i], []).append(i)
        todo = list(pending.items())
        for start in range(0, len(todo), self.chunk_size):
            chunk = todo[start:start + self.chunk_size]
            answers = self.inner.chat([conversations[idx[0]] for _, idx in chunk],
                                      max_new_tokens=max_new_tokens, temperature=temperature)
            self._store([(key, a) for (key, _), a in zip(chunk, answers)])
            for (_, idx), answer in zip(chunk, answers):
                results[idx[0]] = answer
                for dup in idx[1:]:
                    results[dup] = ChatResult(answer.text, answer.prompt_tokens, answer.completion_tokens,
                                              cached=True, error=answer.error)
        with self._lock:
            self.usage.retries = self.inner.usage.retries
        return [r for r in results if r is not None]

    def close(self) -> None:
        with self._db_lock:
            self._db.close()
        self.inner.close()
