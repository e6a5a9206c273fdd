"""Per-dialogue memory store: atomic units, dynamic traces, fact embeddings and build metadata.

On disk a store is one folder (no pickle anywhere)::

    meta.json               {"format": "qgmem-memory-store", "format_version": 1, "dialogue_id": ...,
                             "num_units": U, "num_traces": T, "embedding_dim": D, "extractor": ...,
                             "encoder": ..., "llm": ..., "params": {construction settings}, "counts": {...}}
    units.jsonl             one MemoryUnit per line (MemoryUnit.to_dict), in store order
    traces.jsonl            one MemoryTrace per line
    embeddings.safetensors  tensor "embeddings": float32 [U, D], row i belongs to units.jsonl line i

``meta.json`` also records ``files``: the size and SHA-256 of the three other files, written at save and
checked at load (:mod:`qgmem.integrity`), so flipped bytes or a truncated file are an
:class:`~qgmem.errors.IntegrityError` naming the file, never data used as if it were good. A store is
written into a temporary folder beside its final one and renamed into place when complete; a killed
save leaves a ``.<name>.tmp-<pid>`` folder that :func:`clean_stale_temp` removes. The swap into place
and every load hold the store's lock file (``.<name>.lock`` beside it, :func:`store_lock`), so two
writers never interleave their renames and a reader never sees the folder between them.

``load(directory, expected_meta)`` compares every key given in ``expected_meta`` (recursively, e.g.
``{"extractor": "heuristic", "params": {"window_size": 6}}``) with the stored meta and raises
:class:`StoreMismatchError` naming each difference, or only warns with ``strict=False``.
"""

from __future__ import annotations

import json
import shutil
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from qgmem.errors import InputPathError, IntegrityError
from qgmem.integrity import manifest, plain_mode, publish_dir, remove_stale_temp, temp_path, verify_files
from qgmem.memory.records import MemoryTrace, MemoryUnit

STORE_FORMAT = "qgmem-memory-store"
STORE_FORMAT_VERSION = 1
DATA_FILES = ("units.jsonl", "traces.jsonl", "embeddings.safetensors")
#: what fixes a store that fails its check (build-memory rebuilds such stores instead of reusing them)
REBUILD_HINT = "rebuild it with `qgmem build-memory ... --out <build folder>`, which rebuilds stores that fail this check"


def clean_stale_temp(stores_dir: str | Path) -> list[Path]:
    """Remove half-written store folders left in ``stores_dir`` by killed builds; returns them."""
    return remove_stale_temp(stores_dir)


@contextmanager
def store_lock(directory: str | Path, shared_ok: bool = False) -> Iterator[None]:
    """Hold the lock of the store at ``directory`` (``.<name>.lock`` beside it) while it is swapped or read.

    ``shared_ok``: a reader that cannot create the lock file (a read-only folder, which no one can be
    writing through this code) reads without it.
    """
    from filelock import FileLock

    directory = Path(directory)
    lock = FileLock(str(directory.parent / f".{directory.name}.lock"))
    try:
        lock.acquire()
    except OSError:
        if not shared_ok:
            raise
        lock = None
    try:
        yield
    finally:
        if lock is not None:
            lock.release()


class StoreMismatchError(ValueError):
    """A saved store was built with other parameters than the ones expected."""


def meta_differences(expected: dict[str, Any], actual: dict[str, Any], prefix: str = "") -> list[str]:
    """``"key: expected X, stored Y"`` for every key of ``expected`` that ``actual`` disagrees on."""
    diffs = []
    for key, want in expected.items():
        name = f"{prefix}{key}"
        if key not in actual:
            diffs.append(f"{name}: expected {want!r}, not recorded")
        elif isinstance(want, dict) and isinstance(actual[key], dict):
            diffs.extend(meta_differences(want, actual[key], prefix=f"{name}."))
        elif actual[key] != want:
            diffs.append(f"{name}: expected {want!r}, stored {actual[key]!r}")
    return diffs


@dataclass
class MemoryStore:
    """Everything offline construction produced for one dialogue.

    ``embeddings[i]`` is the normalized fact-level embedding of ``units[i]`` (float32, ``[U, dim]``);
    ``source_embeddings[i]`` that of its source turn (``qgmem.memory.source_turns``), or ``None`` for a
    store built before stores kept them (activation then embeds the turns itself).
    ``meta`` records how it was built (extractor, models, parameters, counts) so a store built with
    other parameters can be recognized on load.
    """

    dialogue_id: str
    units: list[MemoryUnit] = field(default_factory=list)
    traces: list[MemoryTrace] = field(default_factory=list)
    embeddings: np.ndarray = field(default_factory=lambda: np.zeros((0, 0), dtype=np.float32))
    meta: dict[str, Any] = field(default_factory=dict)
    source_embeddings: np.ndarray | None = None

    def __post_init__(self) -> None:
        self._reindex()

    def _reindex(self) -> None:
        self._unit_index = {u.id: i for i, u in enumerate(self.units)}
        self._trace_index = {t.id: t for t in self.traces}

    def __len__(self) -> int:
        return len(self.units)

    def unit(self, unit_id: str) -> MemoryUnit:
        return self.units[self._unit_index[unit_id]]

    def index_of(self, unit_id: str) -> int:
        return self._unit_index[unit_id]

    def trace_of(self, unit: MemoryUnit) -> MemoryTrace | None:
        return self._trace_index.get(unit.trace_id) if unit.trace_id else None

    def save(self, directory: str | Path) -> Path:
        """Write the store to ``directory``: built in a temp folder beside it, then renamed into place."""
        from safetensors.numpy import save_file

        directory = Path(directory)
        embeddings = np.ascontiguousarray(self.embeddings, dtype=np.float32)
        if embeddings.shape[0] != len(self.units):
            raise ValueError(f"store {self.dialogue_id!r}: {embeddings.shape[0]} embeddings for "
                             f"{len(self.units)} units")
        directory.parent.mkdir(parents=True, exist_ok=True)
        tmp = temp_path(directory)
        if tmp.exists():
            shutil.rmtree(tmp)
        tmp.mkdir()
        (tmp / "units.jsonl").write_text(
            "".join(json.dumps(u.to_dict(), ensure_ascii=False) + "\n" for u in self.units), encoding="utf-8")
        (tmp / "traces.jsonl").write_text(
            "".join(json.dumps(t.to_dict(), ensure_ascii=False) + "\n" for t in self.traces), encoding="utf-8")
        tensors = {"embeddings": embeddings}
        if self.source_embeddings is not None:
            source = np.ascontiguousarray(self.source_embeddings, dtype=np.float32)
            if source.shape != embeddings.shape:
                raise ValueError(f"store {self.dialogue_id!r}: source-turn embeddings {source.shape}, "
                                 f"fact embeddings {embeddings.shape}")
            tensors["source_embeddings"] = source
        save_file(tensors, str(tmp / "embeddings.safetensors"), metadata={"format": STORE_FORMAT})
        plain_mode(tmp / "embeddings.safetensors")  # 0644 like units.jsonl, not safetensors' 0600
        meta = {**self.meta, "format": STORE_FORMAT, "format_version": STORE_FORMAT_VERSION,
                "dialogue_id": self.dialogue_id, "num_units": len(self.units), "num_traces": len(self.traces),
                "embedding_dim": int(embeddings.shape[1]) if embeddings.ndim == 2 else 0,
                "files": manifest(tmp, DATA_FILES)}
        (tmp / "meta.json").write_text(json.dumps(meta, ensure_ascii=False, indent=1, sort_keys=True),
                                       encoding="utf-8")
        with store_lock(directory):
            return publish_dir(tmp, directory, if_exists="replace")

    @classmethod
    def load(cls, directory: str | Path, expected_meta: dict[str, Any] | None = None,
             strict: bool = True, verify: bool = True) -> MemoryStore:
        """Read a store written by :meth:`save`; check ``expected_meta`` (see the module docstring).

        ``verify`` (default) checks each file's size and checksum against ``meta.json`` first and
        raises :class:`~qgmem.errors.IntegrityError` naming the file when one differs. The store's lock
        is held while it is read (:func:`store_lock`).
        """
        directory = Path(directory)
        with store_lock(directory, shared_ok=True):
            return cls._load(directory, expected_meta, strict, verify)

    @classmethod
    def _load(cls, directory: Path, expected_meta: dict[str, Any] | None, strict: bool, verify: bool) -> MemoryStore:
        from safetensors import SafetensorError
        from safetensors.numpy import load_file

        directory = Path(directory)
        meta_path = directory / "meta.json"
        if not meta_path.is_file():
            raise InputPathError(f"{meta_path}: not a memory store (no meta.json; was the build interrupted?)",
                                 hint=REBUILD_HINT)
        try:
            meta = json.loads(meta_path.read_text(encoding="utf-8"))
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise IntegrityError(f"{meta_path}: unreadable ({exc})", hint=REBUILD_HINT) from None
        if not isinstance(meta, dict) or meta.get("format") != STORE_FORMAT or \
                meta.get("format_version") != STORE_FORMAT_VERSION:
            found = meta if isinstance(meta, dict) else {}
            raise StoreMismatchError(f"{meta_path}: format {found.get('format')!r} version "
                                     f"{found.get('format_version')!r}, expected {STORE_FORMAT!r} "
                                     f"version {STORE_FORMAT_VERSION}")
        if expected_meta:
            diffs = meta_differences(expected_meta, meta)
            if diffs:
                message = f"{directory}: store was built with other parameters: " + "; ".join(diffs)
                if strict:
                    raise StoreMismatchError(message)
                warnings.warn(message, stacklevel=2)
        if verify:
            if not isinstance(meta.get("files"), dict) or set(meta["files"]) != set(DATA_FILES):
                raise IntegrityError(f"{meta_path}: no checksums recorded for {', '.join(DATA_FILES)} "
                                     "(written before stores carried them, or edited)", hint=REBUILD_HINT)
            verify_files(directory, meta["files"], hint=REBUILD_HINT)

        def read_jsonl(name: str, record):
            path = directory / name
            out = []
            for line_no, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
                if line.strip():
                    try:
                        out.append(record.from_dict(json.loads(line)))
                    except (json.JSONDecodeError, TypeError, KeyError) as e:
                        raise IntegrityError(f"{path}, line {line_no}: {e}", hint=REBUILD_HINT) from None
            return out

        units = read_jsonl("units.jsonl", MemoryUnit)
        traces = read_jsonl("traces.jsonl", MemoryTrace)
        emb_path = directory / "embeddings.safetensors"
        try:
            tensors = load_file(str(emb_path))
            embeddings = tensors["embeddings"]
        except (SafetensorError, OSError, KeyError) as exc:
            raise IntegrityError(f"{emb_path}: unreadable ({type(exc).__name__}: {exc})", hint=REBUILD_HINT) from None
        if len(units) != meta.get("num_units", len(units)) or embeddings.shape[0] != len(units):
            raise IntegrityError(f"{directory}: {len(units)} units, {embeddings.shape[0]} embeddings, meta says "
                                 f"{meta.get('num_units')}: the store is incomplete or was edited", hint=REBUILD_HINT)
        if embeddings.size and not np.isfinite(embeddings).all():
            raise IntegrityError(f"{emb_path}: non-finite embedding values", hint=REBUILD_HINT)
        source = tensors.get("source_embeddings")
        if source is not None:
            if source.shape != embeddings.shape:
                raise IntegrityError(f"{emb_path}: source-turn embeddings {tuple(source.shape)} do not match the "
                                     f"fact embeddings {tuple(embeddings.shape)}", hint=REBUILD_HINT)
            if source.size and not np.isfinite(source).all():
                raise IntegrityError(f"{emb_path}: non-finite source-turn embedding values", hint=REBUILD_HINT)
        return cls(dialogue_id=meta["dialogue_id"], units=units, traces=traces, embeddings=embeddings, meta=meta,
                   source_embeddings=source)
