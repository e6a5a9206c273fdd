"""Integrity of what is written to disk: size + SHA-256 per file, checked at load; stale temp folders.

Whatever writes a cache or a store records :func:`file_record` of each file it wrote (in its own meta
file, written last), and whatever reads it calls :func:`verify_files` first. A mismatch raises
:class:`~qgmem.errors.IntegrityError` naming the file and what differs, with the caller's ``hint`` (the
command that rebuilds it). The size is checked before the hash, so a truncated file is reported as
truncated without reading it all.

Temporary folders follow one naming rule, ``.<name>.tmp-<pid>`` next to the final folder
(:func:`temp_path`); a build that is killed leaves one behind, and :func:`remove_stale_temp` deletes
those whose process is gone (or that are older than ``max_age_s``, in case the pid was reused). Every
atomic write goes through here: :func:`write_text_atomic` for one file, :func:`publish_dir` for a folder.
"""

from __future__ import annotations

import hashlib
import logging
import os
import threading
import re
import shutil
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Literal

from qgmem.errors import IntegrityError

logger = logging.getLogger(__name__)

_CHUNK = 1 << 20
#: the manifest file of a sealed folder (see :func:`seal`)
CHECKSUMS = "checksums.json"
_TEMP = re.compile(r"^\.(?P<name>.+)\.(?:tmp|old)-(?P<pid>\d+)$")


def sha256_file(path: str | Path) -> str:
    """Hex SHA-256 of a file, read in 1 MiB chunks (memory stays flat for large files)."""
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def file_record(path: str | Path) -> dict[str, Any]:
    """``{"size": bytes, "sha256": hex}`` of one file, for a manifest."""
    path = Path(path)
    return {"size": path.stat().st_size, "sha256": sha256_file(path)}


def manifest(directory: str | Path, names: Iterable[str]) -> dict[str, dict[str, Any]]:
    """:func:`file_record` of each named file in ``directory``."""
    directory = Path(directory)
    return {name: file_record(directory / name) for name in names}


def verify_file(path: str | Path, expected: dict[str, Any], hint: str | None = None) -> None:
    """Raise :class:`IntegrityError` unless ``path`` has the recorded size and SHA-256."""
    path = Path(path)
    if not path.is_file():
        raise IntegrityError(f"{path}: missing (or not a file) although it was written with the rest", hint=hint)
    size = path.stat().st_size
    if "size" in expected and size != expected["size"]:
        kind = "truncated" if size < expected["size"] else "longer than written"
        raise IntegrityError(f"{path}: {kind} ({size} bytes, {expected['size']} written)", hint=hint)
    if "sha256" in expected and sha256_file(path) != expected["sha256"]:
        raise IntegrityError(f"{path}: checksum mismatch (the file changed after it was written: corrupt or "
                             "edited)", hint=hint)


def verify_files(directory: str | Path, records: dict[str, dict[str, Any]], hint: str | None = None) -> None:
    """:func:`verify_file` for every entry of a manifest written by :func:`manifest`."""
    for name, expected in records.items():
        verify_file(Path(directory) / name, expected, hint=hint)


def seal(folder: str | Path, names: Iterable[str], listing: str = CHECKSUMS) -> Path:
    """Write ``folder/listing``: the :func:`manifest` of ``names`` (call it last, once they are written)."""
    import json

    folder = Path(folder)
    path = folder / listing
    path.write_text(json.dumps(manifest(folder, sorted(names)), indent=1, sort_keys=True) + "\n", encoding="utf-8")
    return path


def verify_sealed(folder: str | Path, hint: str | None = None, listing: str = CHECKSUMS) -> dict[str, dict[str, Any]]:
    """Check every file a :func:`seal` listing names; a missing or unreadable listing is an error too.

    Returns the listing (what was checked).
    """
    import json

    folder = Path(folder)
    path = folder / listing
    if not path.is_file():
        what = "is missing" if folder.is_dir() else "is missing (with its folder)"
        raise IntegrityError(f"{path}: {what}, so {folder} cannot be verified", hint=hint)
    try:
        records = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise IntegrityError(f"{path}: unreadable ({exc})", hint=hint) from None
    if not isinstance(records, dict) or not all(isinstance(v, dict) for v in records.values()):
        raise IntegrityError(f"{path}: not a checksum listing", hint=hint)
    verify_files(folder, records, hint=hint)
    return records


def plain_mode(path: str | Path) -> None:
    """Give ``path`` the mode an ordinary new file of its folder gets (0644 under the usual umask 022).

    safetensors writes through a private temp file, so its files come out 0600 where their neighbours
    are 0644, and a service account other than the writer could not read them."""
    path = Path(path)
    probe = path.with_name(f".{path.name}.mode-{os.getpid()}-{threading.get_ident()}")
    probe.touch()
    try:
        mode = probe.stat().st_mode & 0o777
    finally:
        probe.unlink()
    os.chmod(path, mode)


def temp_path(final: str | Path, kind: str = "tmp") -> Path:
    """Where to build ``final`` before renaming it into place: ``.<name>.<kind>-<pid>`` beside it."""
    final = Path(final)
    return final.parent / f".{final.name}.{kind}-{os.getpid()}"


def fresh_temp_dir(final: str | Path) -> Path:
    """An empty :func:`temp_path` folder for building ``final`` (a leftover of this pid is removed first)."""
    tmp = temp_path(final)
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    return tmp


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    return True


def stale_temp(parent: str | Path, max_age_s: float = 24 * 3600.0) -> list[Path]:
    """Temp folders/files (see :func:`temp_path`) in ``parent`` left by dead processes or too old."""
    parent = Path(parent)
    if not parent.is_dir():
        return []
    now, out = time.time(), []
    for entry in parent.iterdir():
        m = _TEMP.match(entry.name)
        if m is None:
            continue
        try:
            age = now - entry.lstat().st_mtime
        except FileNotFoundError:  # removed meanwhile by its owner
            continue
        if not _alive(int(m.group("pid"))) or age > max_age_s:
            out.append(entry)
    return sorted(out)


def restore_replaced(final: str | Path) -> Path | None:
    """Put back the folder a killed ``publish_dir(..., if_exists="replace")`` had renamed aside.

    A kill between that function's two renames leaves no ``final`` and the complete old folder as
    ``.<name>.old-<pid>``. When ``final`` is missing and such a folder of a dead process is there, it is
    renamed back (the newest, if several) and a warning says so; returns it, or ``None`` when nothing was
    restored. A live writer's folder is left alone: its swap is still under way.
    """
    final = Path(final)
    if final.exists() or not final.parent.is_dir():
        return None
    aside = []
    for entry in final.parent.iterdir():
        m = _TEMP.match(entry.name)
        if (entry.name.startswith(f".{final.name}.old-") and m is not None and entry.is_dir()
                and not entry.is_symlink() and not _alive(int(m.group("pid")))):
            aside.append(entry)
    if not aside:
        return None
    newest = max(aside, key=lambda e: e.stat().st_mtime)
    try:
        newest.rename(final)
    except OSError:  # another process restored or wrote it meanwhile
        return None
    logger.warning("%s was missing: restored it from %s, which an interrupted replace had left", final, newest.name)
    return final


def remove_stale_temp(parent: str | Path, max_age_s: float = 24 * 3600.0) -> list[Path]:
    """Delete :func:`stale_temp` entries of ``parent``; returns what was removed (to count and report).

    An ``.old-`` folder whose final folder is missing is not deleted but put back (:func:`restore_replaced`).
    """
    removed = []
    for entry in stale_temp(parent, max_age_s):
        name = _TEMP.match(entry.name).group("name")
        if entry.name.startswith(f".{name}.old-"):
            restore_replaced(entry.parent / name)
        if not entry.exists():  # it was put back as its final folder
            continue
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry, ignore_errors=True)
        else:
            entry.unlink(missing_ok=True)
        removed.append(entry)
    return removed


def write_text_atomic(path: str | Path, text: str | bytes) -> Path:
    """Write ``text`` (UTF-8; ``bytes`` as they are) to ``path`` through a :func:`temp_path` file and a
    rename: the one atomic file write.

    A reader sees the old file or the new one, never a part; a kill leaves a temp file that
    :func:`remove_stale_temp` deletes.
    """
    path = Path(path)
    tmp = temp_path(path)
    if isinstance(text, bytes):
        tmp.write_bytes(text)
    else:
        tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)
    return path


def publish_dir(tmp: str | Path, final: str | Path, *, if_exists: Literal["keep", "replace"]) -> Path:
    """Move a fully written ``tmp`` folder to ``final`` by rename: the one atomic folder write.

    ``if_exists`` says what an existing ``final`` means, and every caller says it:

    - ``"keep"``: the first writer wins and the loser's ``tmp`` is removed, for content-keyed folders
      that concurrent writers build identically (cache shards, answer chunks);
    - ``"replace"``: ``final`` is rewritten. A folder cannot be renamed onto a non-empty one, so the
      old one is first renamed aside (``.<name>.old-<pid>``) and removed after; a kill between the two
      renames leaves no ``final`` but the complete old one as a ``.old-`` folder, never a half-written
      ``final``; :func:`restore_replaced` puts it back (:func:`remove_stale_temp` and loading an export
      call it).
    """
    tmp, final = Path(tmp), Path(final)
    if if_exists == "keep":
        try:
            os.replace(tmp, final)
        except OSError:
            if not final.exists():
                raise
            shutil.rmtree(tmp, ignore_errors=True)
        return final
    if if_exists != "replace":
        raise ValueError(f"if_exists must be 'keep' or 'replace', got {if_exists!r}")
    old = None
    if final.exists():
        old = temp_path(final, "old")
        if old.exists():
            shutil.rmtree(old)
        final.rename(old)
    tmp.rename(final)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
    return final
