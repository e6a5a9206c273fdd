"""Per-dialogue memory store: atomic units, dynamic traces, fact embeddings and build metadata."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from qgmem.memory.records import MemoryTrace, MemoryUnit


@dataclass
class MemoryStore:
    """Everything offline construction produced for one dialogue.

    ``embeddings[i]`` is the normalized fact-level embedding of ``units[i]`` (float32, ``[U, dim]``).
    ``meta`` records how it was built (extractor, models, parameters, counts) so a store built with
    other parameters can be recognized on load.
    """

    dialogue_id: str
    units: list[MemoryUnit] = field(default_factory=list)
    traces: list[MemoryTrace] = field(default_factory=list)
    embeddings: np.ndarray = field(default_factory=lambda: np.zeros((0, 0), dtype=np.float32))
    meta: dict[str, Any] = field(default_factory=dict)

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
