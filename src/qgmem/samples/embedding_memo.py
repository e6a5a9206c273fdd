"""A per-text memo of sentence embeddings for the cache build, kept on disk next to the cache.

Why: the same texts recur across cases. ConvoMem's cases of one persona share their distractor
conversations, so the same unit facts, relation keys, node names and predicates come back case after
case (over the 525 cases of the sample, 160k encoder inputs hold only 40k distinct texts). Encoding
is most of a heuristic replay's time, so each distinct text is encoded once: within a process, across
the processes of a sharded build (each flushes its own chunk files, so writers never collide), and
across rebuilds with other construction or activation settings (an ``activation.k`` sweep re-encodes
nothing). The folder is keyed by the encoder's id and width; a vector is stored as the encoder first
returned it.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import socket
import time
from pathlib import Path

import numpy as np

from qgmem.errors import IntegrityError
from qgmem.integrity import fresh_temp_dir
from qgmem.samples import cache as C

log = logging.getLogger(__name__)


def text_key(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:32]


class EmbeddingMemo:
    """Wraps an encoder (``dim``, ``encode``): distinct texts are encoded once, and persisted in chunks.

    ``flush_every`` new vectors are written as one Arrow chunk (atomically); :meth:`flush` writes the
    rest. A process reads the chunks present when it starts; ``max_entries`` bounds its memory (past
    it, older chunks are not loaded and new vectors are still encoded and written).
    """

    def __init__(self, encoder, root: str | Path, *, flush_every: int = 4096, max_entries: int = 2_000_000):
        self.encoder = encoder
        self.dim = int(encoder.dim)
        self.model_id = getattr(encoder, "model_id", type(encoder).__name__)
        self.root = Path(root)
        self.flush_every, self.max_entries = flush_every, max_entries
        self._vectors: dict[str, np.ndarray] = {}
        self._pending: dict[str, np.ndarray] = {}
        self.loaded = self.hits = self.misses = 0
        self._load()

    # ---- disk -------------------------------------------------------------------------------------

    def _chunks(self) -> list[Path]:
        return sorted(p for p in self.root.glob("chunk-*") if p.is_dir()) if self.root.exists() else []

    def _load(self) -> None:
        for chunk in reversed(self._chunks()):  # newest first, so the bound keeps the latest
            if len(self._vectors) >= self.max_entries:
                break
            try:  # a damaged chunk is removed: its texts are simply encoded again
                C.verify_folder(chunk)
                table = C.load_arrow(chunk).data  # the Arrow table: no per-row Python objects
            except IntegrityError as exc:
                log.warning("embedding memo chunk dropped, its texts are encoded again: %s", exc)
                shutil.rmtree(chunk, ignore_errors=True)
                continue
            keys = table.column("key").to_pylist()
            flat = table.column("vector").combine_chunks().flatten().to_numpy()
            self._vectors.update(zip(keys, np.asarray(flat, dtype=np.float32).reshape(len(keys), self.dim)))
        self.loaded = len(self._vectors)

    def flush(self) -> None:
        """Write the vectors encoded since the last flush as one chunk (no-op when there are none)."""
        if not self._pending:
            return
        from datasets import Dataset, Features, List, Value

        self.root.mkdir(parents=True, exist_ok=True)
        if not (self.root / "settings.json").exists():
            C.write_json(self.root / "settings.json", {"encoder": self.model_id, "dim": self.dim})
        # time first (sorted = written order), then host and pid: ranks on several nodes never collide
        final = self.root / f"chunk-{time.time_ns():020d}-{socket.gethostname()}-{os.getpid()}"
        tmp = fresh_temp_dir(final)
        features = Features({"key": Value("string"), "vector": List(Value("float32"), length=self.dim)})
        with C.quiet_datasets():
            Dataset.from_dict({"key": list(self._pending), "vector": np.stack(list(self._pending.values()))},
                              features=features).save_to_disk(str(tmp))
        C.publish(tmp, final)
        self._pending = {}

    # ---- the encoder interface --------------------------------------------------------------------

    def encode(self, texts: list[str]) -> np.ndarray:
        """``[len(texts), dim]`` float32, the same as the wrapped encoder's for each text."""
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        keys = [text_key(t) for t in texts]
        missing = {k: t for k, t in zip(keys, texts) if k not in self._vectors}
        self.hits += len(texts) - len(missing)
        if missing:
            vectors = np.asarray(self.encoder.encode(list(missing.values())), dtype=np.float32)
            self.misses += len(missing)
            new = dict(zip(missing, vectors))
            self._vectors.update(new)
            self._pending.update(new)
            if len(self._pending) >= self.flush_every:
                self.flush()
        return np.stack([self._vectors[k] for k in keys])

    def stats(self) -> dict[str, int]:
        return {"loaded": self.loaded, "hits": self.hits, "encoded": self.misses}


__all__ = ["EmbeddingMemo", "text_key"]
