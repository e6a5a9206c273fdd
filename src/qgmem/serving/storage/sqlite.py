"""``sqlite:///PATH``: the embedded store, one file (the standard library's ``sqlite3``).

WAL mode with ``synchronous=FULL``: a commit is on disk when it returns, readers never wait for the
writer. A write is ``BEGIN IMMEDIATE`` (it takes the file's write lock first), so writers of the same
file, in this process or another, are serialized; reads run in their own short transactions. Each thread
keeps its own connection.
"""

from __future__ import annotations

import sqlite3
import threading
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import unquote, urlsplit

from qgmem.errors import UserError
from qgmem.serving.storage.base import SqlStore, StoreFull, StoreUnavailable

#: seconds a write waits for another writer's lock before the request gets 503
BUSY_TIMEOUT_S = 30.0


def sqlite_path(url: str) -> Path:
    """The file of ``sqlite:///PATH`` (``sqlite:////abs/path`` or ``sqlite:///relative/path``)."""
    parts = urlsplit(url)
    if parts.netloc or not parts.path.startswith("/") or parts.path == "/":
        raise UserError(f"store {url[:200]!r}: a SQLite URL is sqlite:///PATH (three slashes, then the file)")
    return Path(unquote(parts.path[1:]))


class SqliteStore(SqlStore):
    """The users' memories in one SQLite file."""

    def __init__(self, url: str):
        self.url = url
        self.path = sqlite_path(url)
        if self.path.is_dir():
            raise UserError(f"store {url}: {self.path} is a folder; name the database file in it "
                            f"(e.g. sqlite:///{self.path / 'memories.db'})")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._local = threading.local()
        self._all: list[sqlite3.Connection] = []
        self._lock = threading.Lock()
        with self._tx(write_user="") as cur:
            self._migrate(cur)

    def _connection(self) -> sqlite3.Connection:
        conn = getattr(self._local, "conn", None)
        if conn is None:
            conn = sqlite3.connect(self.path, isolation_level=None, timeout=BUSY_TIMEOUT_S, check_same_thread=False)
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=FULL")
            self._local.conn = conn
            with self._lock:
                self._all.append(conn)
        return conn

    @contextmanager
    def _transaction(self, write_user: str | None = None):
        conn = self._connection()
        cur = conn.cursor()
        cur.execute("BEGIN IMMEDIATE" if write_user is not None else "BEGIN")
        try:
            yield cur
        except BaseException:
            if conn.in_transaction:
                conn.rollback()
            raise
        else:
            try:
                cur.execute("COMMIT")
            except BaseException:
                if conn.in_transaction:
                    conn.rollback()
                raise

    def _failure(self, exc: BaseException) -> BaseException | None:
        if not isinstance(exc, sqlite3.OperationalError):
            return None
        text = str(exc)
        if "full" in text:
            return StoreFull(f"the store's disk is full ({text}); nothing of this request was stored")
        if "locked" in text or "busy" in text or "unable to open" in text or "disk I/O" in text:
            return StoreUnavailable(f"the store is unavailable ({text}); nothing of this request was stored")
        return None

    def close(self) -> None:
        with self._lock:
            for conn in self._all:
                try:
                    conn.close()
                except sqlite3.ProgrammingError:  # made in a thread that is gone: closed with it
                    pass
            self._all.clear()
        self._local = threading.local()
