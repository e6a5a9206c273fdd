"""What several bench scripts share: the repository root, a free port, resident memory, paired
intervals (through :mod:`qgmem.evaluation.bootstrap`, as the learning check reports them) and their
printed form, and the stand-in sentence encoders.

Scripts run from the repository root as modules (``python -m bench.serving.serve_load``), so they
import this as ``bench.common``.
"""

from __future__ import annotations

import hashlib
import re
import socket
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[1]


def free_port() -> int:
    """A localhost port the OS has just handed out, for a server a bench starts."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rss_mb(pid: int | str = "self") -> float:
    """Current resident set size of ``pid`` in MiB (Linux /proc; NaN where it cannot be read)."""
    try:
        lines = Path(f"/proc/{pid}/status").read_text(encoding="ascii").splitlines()
    except OSError:
        return float("nan")
    for line in lines:
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def paired_interval(a, b, n_boot: int = 1000, seed: int = 0) -> tuple[float, float, float]:
    """Mean of ``b − a`` over questions and its 95 % bootstrap interval (questions resampled)."""
    from qgmem.evaluation.bootstrap import paired_bootstrap

    r = paired_bootstrap(np.asarray(b, dtype=np.float64) - np.asarray(a, dtype=np.float64), n_boot=n_boot, seed=seed)
    return r["mean"], r["ci95"][0], r["ci95"][1]


def ci(result: dict[str, Any] | None, digits: int = 3) -> str:
    """A bootstrap result (``mean``, ``ci95``) as ``+m [+lo, +hi]``; ``-`` when there is none."""
    if not result or result.get("mean") is None:
        return "-"
    lo, hi = result["ci95"]
    return f"{result['mean']:+.{digits}f} [{lo:+.{digits}f}, {hi:+.{digits}f}]"


class HashEncoder:
    """Words hashed into signed buckets, normalized: an instant, deterministic stand-in encoder."""

    model_id = "bench:hash"

    def __init__(self, dim: int):
        self.dim = dim

    def encode(self, texts):
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        for i, text in enumerate(texts):
            for word in re.findall(r"\w+", text.lower()):
                h = int(hashlib.md5(word.encode()).hexdigest(), 16)
                out[i, h % self.dim] += 1.0 if (h >> 8) % 2 else -1.0
            out[i] /= max(float(np.linalg.norm(out[i])), 1e-12)
        return out


class MemoEncoder:
    """A sentence encoder with its vectors remembered by text, so a text repeated across the calls is
    encoded once (the vectors are identical either way); ``reset`` forgets them."""

    def __init__(self, encoder):
        self.encoder, self.dim, self.model_id = encoder, encoder.dim, getattr(encoder, "model_id", "encoder")
        self.reset()

    def reset(self) -> None:
        self._vectors: dict[str, np.ndarray] = {}

    def encode(self, texts) -> np.ndarray:
        texts = list(texts)
        missing = list(dict.fromkeys(t for t in texts if t not in self._vectors))
        if missing:
            self._vectors.update(zip(missing, np.asarray(self.encoder.encode(missing), dtype=np.float32)))
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        return np.stack([self._vectors[t] for t in texts])
