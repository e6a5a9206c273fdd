"""The ``--out`` folder of ``qgmem build-memory``: its layout, its index, the writer's lock, and reading one store.

Layout::

    OUT/index.jsonl        {"dialogue_id", "folder": "stores/<name>", "units", "traces"} per dialogue
    OUT/summary.json       the build counts
    OUT/stores/<name>/     one store (:mod:`qgmem.memory.store`)
    OUT/.build.lock        held by the build that is writing OUT

One build writes an ``OUT`` at a time (:func:`build_lock`): a second one stops at once with a message
naming the lock, so ``index.jsonl`` and ``summary.json`` are never a mix of two runs. Each store's own
swap is locked too (:meth:`MemoryStore.save` / :meth:`MemoryStore.load`), so a reader never sees a
half-replaced store folder.

:func:`load_built_store` picks the store to serve by the index, never by what happens to be readable:
a store the index names that cannot be read is an error naming that store, and a folder with several
stores needs the dialogue id.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from qgmem.errors import InputPathError, UserError
from qgmem.integrity import write_text_atomic

INDEX_FILE = "index.jsonl"
SUMMARY_FILE = "summary.json"
STORES_DIR = "stores"
BUILD_LOCK = ".build.lock"


class OutputBusyError(UserError):
    """Another build holds the output folder's lock."""


@contextmanager
def build_lock(out: str | Path, timeout_s: float = 0.0) -> Iterator[None]:
    """Hold ``OUT/.build.lock`` for a whole build; another holder (a live process) is an :class:`OutputBusyError`.

    The lock is an OS file lock: it goes with its process, so a killed build never leaves ``OUT`` locked.
    """
    from filelock import FileLock, Timeout

    out = check_out(out)
    out.mkdir(parents=True, exist_ok=True)
    lock = FileLock(str(out / BUILD_LOCK), timeout=timeout_s)
    try:
        lock.acquire()
    except Timeout:
        raise OutputBusyError(f"{out}: another `qgmem build-memory` is writing this folder (it holds "
                              f"{out / BUILD_LOCK})", hint="wait for it to finish, or give another --out") from None
    try:
        yield
    finally:
        lock.release()


def check_out(out: str | Path) -> Path:
    """``out`` as a folder to write: one that exists as anything but a folder is an :class:`InputPathError`."""
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise InputPathError(f"--out {out} is not a folder (a file of that name exists); give a folder")
    for parent in out.parents:  # a file in the way of the folder's parents gives the same error
        if parent.exists():
            if not parent.is_dir():
                raise InputPathError(f"--out {out}: {parent} is not a folder (a file of that name exists)")
            break
    return out


def write_index(out: Path, rows: list[dict[str, Any]]) -> None:
    write_text_atomic(out / INDEX_FILE, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))


def read_index(out: Path) -> list[dict[str, Any]]:
    """The rows of ``OUT/index.jsonl``; a damaged line is an :class:`~qgmem.errors.IntegrityError` naming it."""
    from qgmem.errors import IntegrityError

    path = out / INDEX_FILE
    rows = []
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            if not isinstance(row, dict) or not isinstance(row.get("dialogue_id"), str) or \
                    not isinstance(row.get("folder"), str):
                raise ValueError("expected an object with 'dialogue_id' and 'folder'")
        except ValueError as exc:
            raise IntegrityError(f"{path}, line {n}: {exc}", hint="run `qgmem build-memory` again") from None
        rows.append(row)
    return rows


def load_built_store(folder: str | Path, dialogue_id: str | None = None):
    """The store to serve from ``folder``: one store folder, or a build's ``OUT`` (by ``index.jsonl``).

    ``dialogue_id`` picks one store of several; without it the folder must hold exactly one. The
    chosen store's damage is an error naming it; no other store is ever served in its place.
    """
    from qgmem.memory.store import REBUILD_HINT, MemoryStore

    folder = Path(folder)
    if (folder / "meta.json").is_file():
        store = MemoryStore.load(folder)
        if dialogue_id is not None and store.dialogue_id != dialogue_id:
            raise UserError(f"{folder}: holds the store of dialogue {store.dialogue_id!r}, not {dialogue_id!r}")
        return store
    if (folder / INDEX_FILE).is_file():
        rows = [(r["dialogue_id"], folder / r["folder"]) for r in read_index(folder)]
    elif (folder / STORES_DIR).is_dir():  # an OUT without its index (an older or interrupted build)
        rows = [(None, p) for p in sorted((folder / STORES_DIR).iterdir()) if p.is_dir() and not p.name.startswith(".")]
    else:
        rows = []
    if not rows:
        raise InputPathError(f"{folder}: no memory store (neither a store folder with meta.json nor the "
                             "--out folder of `qgmem build-memory`)")
    if dialogue_id is None:
        if len(rows) > 1:
            ids = ", ".join(str(d) if d is not None else p.name for d, p in rows[:10])
            raise UserError(f"{folder}: holds {len(rows)} stores; name one with dialogue_id (--dialogue): {ids}"
                            f"{', ...' if len(rows) > 10 else ''}")
        wanted, path = rows[0]
    else:
        indexed = [p for d, p in rows if d == dialogue_id]
        if indexed:
            wanted, path = dialogue_id, indexed[0]
        elif all(d is not None for d, _ in rows):
            ids = ", ".join(d for d, _ in rows[:10])
            raise UserError(f"{folder}: no store of dialogue {dialogue_id!r} in {INDEX_FILE} (it lists "
                            f"{len(rows)}: {ids}{', ...' if len(rows) > 10 else ''})")
        else:  # no index: open each store to read its id; any unreadable one is an error naming it
            for _, path in rows:
                store = MemoryStore.load(path)
                if store.dialogue_id == dialogue_id:
                    return store
            raise UserError(f"{folder}: none of its {len(rows)} stores is dialogue {dialogue_id!r}")
    store = MemoryStore.load(path)  # damage names this store (and says how to rebuild it)
    if wanted is not None and store.dialogue_id != wanted:
        raise UserError(f"{path}: holds dialogue {store.dialogue_id!r}, but {folder / INDEX_FILE} says "
                        f"{wanted!r}", hint=REBUILD_HINT)
    return store
