"""The journal of the folder store of earlier versions (``users/<id>/journal.jsonl``): the line format,
its checksums and how it is read, for ``qgmem migrate-store`` (:mod:`qgmem.serving.storage.folders`); and
what an idempotency key stands for (:func:`session_digest`, :func:`batch_digest`), which the database
stores keep as the folder store did.

One change per line, in order: an appended session ``{"seq", "turns", "time", "sha256"}`` (with its
idempotency ``key`` and first ``result`` when it had one) or a forgotten unit ``{"seq", "forget",
"sha256"}``; the sessions of one batch append carry ``"batch": [i, n]``, the last one the batch's key,
result and ``request_sha256``. The folder store wrote the lines; :mod:`qgmem.serving.storage.folders`
decides what a damaged or cut journal means for a user it moves; this module is the format.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from qgmem.errors import IntegrityError

JOURNAL = "journal.jsonl"


def _sha256(content: Any) -> str:
    return hashlib.sha256(json.dumps(content, sort_keys=True, ensure_ascii=False).encode("utf-8")).hexdigest()


def session_digest(turns: list[dict[str, Any]], session_time: str | None) -> str:
    """What an idempotency key of one appended session stands for: the session's content."""
    return _sha256({"turns": turns, "time": session_time})


def batch_digest(sessions: list[tuple[list[dict[str, Any]], str | None]]) -> str:
    """What an idempotency key of a batch append stands for: its sessions, in order."""
    return _sha256({"batch": [{"turns": turns, "time": when} for turns, when in sessions]})


def line_digest(entry: dict[str, Any]) -> str:
    """The checksum of one journal line: everything but its ``seq`` and the checksum itself (a session
    line's digest is the one it always had: its turns and time, plus its key and first result if any)."""
    return _sha256({k: v for k, v in entry.items() if k not in ("seq", "sha256") and v is not None
                    or k == "time"})


def read_journal(path: Path) -> list[dict[str, Any] | None]:
    """The journal's lines (sessions and forgets) in order; the last entry is ``None`` when the file ends in a torn line.

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
        entry = parse_line(line)
        if entry is None or entry["seq"] != len(out):
            raise IntegrityError(f"{path}, line {number}: not a whole journal entry (seq {len(out)} expected); "
                                 "the journal was damaged or edited after the session was acknowledged")
        out.append(entry)
    if tail:  # no newline: the write was cut by a kill before it was acknowledged
        out.append(None)
    return out


def parse_line(line: bytes) -> dict[str, Any] | None:
    """One complete line's entry; ``None`` when it is not a whole entry or fails its checksum."""
    try:
        entry = json.loads(line.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError):
        return None
    if not isinstance(entry, dict) or not isinstance(entry.get("seq"), int):
        return None
    if not isinstance(entry.get("turns"), list) and not isinstance(entry.get("forget"), str):
        return None
    if entry.get("sha256") != line_digest(entry):
        return None
    return entry


def unfinished_batch(entries: list[dict[str, Any]], path: Path) -> int:
    """How many lines at the journal's end belong to a batch whose last line is missing (0: none). A batch
    broken anywhere else was acknowledged and then damaged: an :class:`~qgmem.errors.IntegrityError`."""
    under_way = None  # (next position, size) of the batch being read
    for number, entry in enumerate(entries, start=1):
        position = entry.get("batch")
        if under_way is None and position is None:
            continue
        if under_way is None:
            fits = (isinstance(position, list) and len(position) == 2 and position[0] == 0
                    and isinstance(position[1], int) and position[1] >= 1)
        else:
            fits = position == list(under_way)
        if not fits:
            raise IntegrityError(f"{path}, line {number}: batch position {position} does not follow the lines before "
                                 "it; the journal was damaged or edited after the batch was acknowledged")
        under_way = None if position[0] == position[1] - 1 else (position[0] + 1, position[1])
    return 0 if under_way is None else under_way[0]
