"""The one finiteness check: which named tensors hold a NaN or an inf.

Shared by the training guard (loss, gradients), the export (weights) and the cache build (features),
so "non-finite" means the same everywhere. It imports nothing from qgmem, so any layer can use it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch


def nonfinite_names(named: Mapping[str, Any]) -> list[str]:
    """Names (in order) of the floating-point tensors or arrays in ``named`` that hold a NaN or an inf.

    Integer tensors and ``None`` are finite by definition; all checks run in one device sync.
    """
    tensors = {name: torch.as_tensor(value) for name, value in named.items() if value is not None}
    names = [n for n, t in tensors.items() if t.is_floating_point() or t.is_complex()]
    if not names:
        return []
    finite = torch.stack([torch.isfinite(tensors[n]).all() for n in names]).cpu().tolist()
    return [n for n, ok in zip(names, finite) if not ok]
