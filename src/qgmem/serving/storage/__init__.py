"""Where ``qgmem serve`` keeps its users' memories: one small interface, one module per database.

:class:`~qgmem.serving.storage.base.Store` is what :class:`~qgmem.serving.users.UserMemories` needs
(an append-only log of changes per user, idempotency keys, a snapshot row for a fast cold load, export,
import, deletion); :func:`open_store` picks the backend by the URL's scheme:

- ``sqlite:///PATH`` (:mod:`.sqlite`): the embedded default, one file, WAL, synchronous commits;
- ``postgresql://…`` (:mod:`.postgres`): any libpq URL, a connection pool, many replicas over one database.

The folder format of earlier versions (a journal and snapshots per user) is read by :mod:`.folders`
only, for ``qgmem migrate-store``.
"""

from __future__ import annotations

from qgmem.errors import UserError

#: ``qgmem serve``'s store when none is named: a SQLite file under ``memories/``
DEFAULT_STORE = "sqlite:///memories/memories.db"


def store_kind(url: str) -> str:
    """``"sqlite"`` or ``"postgresql"``, from the URL's scheme (checked before anything is opened)."""
    scheme = url.split(":", 1)[0].lower() if "://" in url else ""
    if scheme == "sqlite":
        from qgmem.serving.storage.sqlite import sqlite_path

        sqlite_path(url)
        return "sqlite"
    if scheme in ("postgresql", "postgres"):
        return "postgresql"
    raise UserError(f"store {url[:200]!r} is not a store URL: sqlite:///PATH or postgresql://… "
                    f"(the default is {DEFAULT_STORE})")


def open_store(url: str, **options):
    """The store ``url`` names (``options``: the backend's, e.g. ``pool_size`` for Postgres), its schema
    migrated to this version's."""
    if store_kind(url) == "sqlite":
        from qgmem.serving.storage.sqlite import SqliteStore

        return SqliteStore(url)
    from qgmem.serving.storage.postgres import PostgresStore

    return PostgresStore(url, **options)
