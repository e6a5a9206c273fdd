"""The folder format of earlier versions, read only to move it into a database (``qgmem migrate-store``).

A store root of that format holds ``users/<id>/journal.jsonl`` (the changes, :mod:`qgmem.serving.journal`)
and ``users/<id>/snapshot-<seq:08d>/`` (a MemoryStore after the first ``seq`` lines). A user moves with
every whole journal line as a change (keys and their first results included), and the newest snapshot
that passes its checks as the snapshot row, in one transaction per user: a kill leaves whole users, and
a rerun skips the users already there. When every user is moved, ``MOVED`` in the root names the store;
``qgmem serve`` refuses a root of this format without it, naming the command.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from qgmem.errors import IntegrityError, UserError
from qgmem.integrity import write_text_atomic
from qgmem.serving.journal import JOURNAL, read_journal, session_digest, unfinished_batch

_SNAPSHOT = re.compile(r"snapshot-(\d{8})$")
#: written into a store root once all its users are in a database
MOVED = "MOVED"


@dataclass
class FolderUser:
    """One user of a folder root: their changes, keys ``(key, digest, result, seq)`` and newest snapshot."""

    user_id: str
    changes: list[dict[str, Any]]
    keys: list[tuple[str, str, dict[str, Any], int]] = field(default_factory=list)
    snapshot: Any = None
    snapshot_seq: int = 0


def folder_users(root: Path) -> list[Path]:
    """The user folders of an earlier version's store root (a journal or a snapshot in each)."""
    users = root / "users"
    if not users.is_dir():
        return []
    return sorted(p for p in users.iterdir() if p.is_dir() and ((p / JOURNAL).is_file()
                                                                 or any(_SNAPSHOT.match(q.name) for q in p.iterdir())))


def read_user(folder: Path) -> FolderUser:
    """A user as the folder store loaded them: a torn last line and an unfinished batch (never
    acknowledged) dropped; a damaged line, or a snapshot ahead of the journal, an IntegrityError."""
    snapshots = sorted((int(m.group(1)), p) for p in folder.iterdir() if (m := _SNAPSHOT.match(p.name)))
    if not (folder / JOURNAL).is_file():
        raise IntegrityError(f"{folder / JOURNAL} is missing beside {snapshots[-1][1].name}: the user's "
                             "acknowledged sessions are not all there; restore the journal or leave the user out")
    entries = read_journal(folder / JOURNAL)
    if entries and entries[-1] is None:
        entries.pop()
    unfinished = unfinished_batch(entries, folder / JOURNAL)
    if unfinished:
        del entries[-unfinished:]
    if snapshots and snapshots[-1][0] > len(entries):
        raise IntegrityError(f"{snapshots[-1][1]} holds {snapshots[-1][0]} sessions but {folder / JOURNAL} only "
                             f"{len(entries)}: the journal lost acknowledged sessions")
    user = FolderUser(folder.name, [{"forget": e["forget"]} if "forget" in e else
                                    {"turns": e["turns"], "time": e.get("time")} for e in entries])
    for seq, entry in enumerate(entries):
        if isinstance(entry.get("key"), str) and isinstance(entry.get("result"), dict):
            digest = entry.get("request_sha256") or session_digest(entry["turns"], entry.get("time"))
            user.keys.append((entry["key"], digest, entry["result"], seq))
    for n, path in reversed(snapshots):
        store = _load_snapshot(path)
        if store is not None and store.meta.get("journal_seq") == n and store.dialogue_id == folder.name:
            store.meta.pop("journal_seq", None)
            user.snapshot, user.snapshot_seq = store, n
            break
    return user


def _load_snapshot(path: Path) -> Any:
    from qgmem.memory.store import MemoryStore

    try:
        return MemoryStore.load(path)
    except (UserError, ValueError, OSError):
        return None  # damaged: the changes rebuild it
    finally:
        (path.parent / f".{path.name}.lock").unlink(missing_ok=True)


def migrate(root: Path, store: Any, log=print) -> dict[str, int]:
    """Every user of ``root`` into ``store`` (skipping those already there); ``MOVED`` written at the end."""
    if not (root / "users").is_dir():
        raise UserError(f"{root}: not a store root of the folder format (no users/ folder in it)")
    moved = present = units = behind = 0
    for folder in folder_users(root):
        user = read_user(folder)
        if store.version(user.user_id) is not None:
            present += 1
            continue
        if not store.import_user(user.user_id, user.changes, user.snapshot, user.keys,
                                 snapshot_seq=user.snapshot_seq):
            present += 1
            continue
        moved += 1
        units += len(user.snapshot) if user.snapshot is not None else 0
        behind += user.snapshot_seq < len(user.changes)
        log(f"{user.user_id}: {len(user.changes)} changes, "
            f"{len(user.snapshot) if user.snapshot is not None else 0} units")
    write_text_atomic(root / MOVED, f"moved to {store.url_shown()} at {time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())}; "
                                    "qgmem no longer reads this folder\n")
    return {"users": moved, "units": units, "already_there": present, "replayed_at_load": behind}


def refuse_folder_root(url: str) -> None:
    """A store root of the folder format where ``qgmem serve`` would open its store (``url`` itself, or the
    folder of a SQLite file), not yet moved: one line naming ``qgmem migrate-store``."""
    if "://" not in url:
        root, target = Path(url), f"sqlite:///{Path(url) / 'memories.db'}"
    elif url.lower().startswith("sqlite:"):
        from qgmem.serving.storage.sqlite import sqlite_path

        root, target = sqlite_path(url).parent, url
    else:
        return
    if folder_users(root) and not (root / MOVED).exists():
        raise UserError(f"{root} holds users' memories in the folder format of earlier versions; move them into "
                        f"a database first: qgmem migrate-store --from {root} --to {target}")
