"""``postgresql://…``: the users' memories in PostgreSQL (psycopg 3 and its connection pool).

Any libpq URL works, a socket folder included (``postgresql://postgres@/postgres?host=/run/pg``). A write
takes a transaction-level advisory lock on the user (``pg_advisory_xact_lock``), so the writers of one user
are serialized across every replica and the lock goes with the commit or the rollback; reads take no
lock. A connection the database dropped (a restart) fails its request with 503 and is replaced, so the
service recovers without a restart of its own.
"""

from __future__ import annotations

from contextlib import contextmanager
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from qgmem.errors import UserError
from qgmem.serving.storage.base import SqlStore, StoreFull, StoreUnavailable

#: connections per replica (each request holds one only for its statements, never while it computes)
POOL_SIZE = 8
#: seconds a request waits for a connection before it gets 503
POOL_TIMEOUT_S = 10.0
#: the advisory lock's key space of schema migrations (replicas starting together migrate once)
_MIGRATION_LOCK = 0x716d656d


def shown_url(url: str) -> str:
    """``url`` with its password masked, in the user part and in a ``password=`` query parameter (libpq takes
    either), so a message or log line naming the store never carries it."""
    parts = urlsplit(url)
    netloc = parts.netloc
    if "@" in netloc:
        user, host = netloc.rsplit("@", 1)
        if ":" in user:
            netloc = f"{user.split(':', 1)[0]}:***@{host}"
    query = parse_qsl(parts.query, keep_blank_values=True)
    if any(k.lower() == "password" for k, _ in query):
        query = urlencode([(k, "***" if k.lower() == "password" else v) for k, v in query], safe="*/")
    else:
        query = parts.query
    return urlunsplit(parts._replace(netloc=netloc, query=query))


class PostgresStore(SqlStore):
    """The users' memories in one PostgreSQL database, shared by any number of replicas."""

    PARAM = "%s"
    BLOB = "BYTEA"

    def __init__(self, url: str, pool_size: int = POOL_SIZE):
        import psycopg
        from psycopg_pool import ConnectionPool

        self.url = url
        self._errors = (psycopg.OperationalError, psycopg.errors.AdminShutdown)
        self.pool = ConnectionPool(url, min_size=1, max_size=pool_size, timeout=POOL_TIMEOUT_S, open=False,
                                   kwargs={"autocommit": False})
        try:
            self.pool.open(wait=True, timeout=POOL_TIMEOUT_S)
        except Exception as exc:  # noqa: BLE001 - psycopg_pool.PoolTimeout: the database is not there
            self.pool.close()
            raise UserError(f"store {self.url_shown()}: cannot connect within {POOL_TIMEOUT_S:g} s ({exc}); is "
                            "the database running, and the URL's host, port, user and password right?") from None
        with self._tx() as cur:
            self._run(cur, "SELECT pg_advisory_xact_lock(?)", (_MIGRATION_LOCK,))
            self._migrate(cur)

    def url_shown(self) -> str:
        return shown_url(self.url)

    @contextmanager
    def _transaction(self, write_user: str | None = None):
        with self.pool.connection() as conn:
            with conn.transaction():
                cur = conn.cursor()
                if write_user:
                    cur.execute("SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))", (write_user,))
                yield cur

    def _failure(self, exc: BaseException) -> BaseException | None:
        from psycopg_pool import PoolTimeout

        if isinstance(exc, PoolTimeout) or isinstance(exc, self._errors):
            if "No space left" in str(exc) or "disk full" in str(exc).lower():
                return StoreFull(f"the store's disk is full ({str(exc).strip()[:200]}); nothing of this request "
                                 "was stored")
            return StoreUnavailable(f"the store is unavailable ({type(exc).__name__}: {str(exc).strip()[:200]}); "
                                    "nothing of this request was stored")
        return None

    def close(self) -> None:
        self.pool.close()
