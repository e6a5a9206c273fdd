"""A store without some of its units: the one rule for removing units, shared by a user's forget in the
memory service and by the evidence-ablated and sham stores of the graph-token study.

The traces are rebuilt over the units that are left, so no trajectory keeps pointing at a removed state.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Callable

import numpy as np

from qgmem.memory.config import ConstructionConfig
from qgmem.memory.store import MemoryStore
from qgmem.memory.traces import build_traces


def without_units(store: MemoryStore, drop: set[str], encode: Callable[[list[str]], np.ndarray],
                  config: ConstructionConfig, llm: Any = None) -> MemoryStore:
    """A copy of ``store`` without the units in ``drop``; traces rebuilt over the rest (``store`` is untouched)."""
    keep = [i for i, u in enumerate(store.units) if u.id not in drop]
    units = [replace(store.units[i], trace_id=None) for i in keep]
    embeddings = store.embeddings[keep] if len(store.embeddings) else store.embeddings
    report = build_traces(units, embeddings, encode, config, llm=llm)
    meta = {**store.meta, "ablated_units": len(store.units) - len(units)}
    source = store.source_embeddings[keep] if store.source_embeddings is not None else None
    return MemoryStore(dialogue_id=store.dialogue_id, units=units, traces=report.traces,
                       embeddings=np.asarray(embeddings, dtype=np.float32), meta=meta, source_embeddings=source)
