"""Each unit's source turn as text and as a vector: what activation's ``source`` channel searches.

Construction rewrites a turn into atomic facts, and the rewrite drops words and context a question may
share with the turn. The store therefore keeps one embedding of each unit's source turn beside its fact
embedding, computed once at build time (each distinct turn encoded once), so activation over a large
store does not re-embed its dialogue when it starts.
"""

from __future__ import annotations

import numpy as np

from qgmem.memory.records import MemoryUnit


def source_turn_text(unit: MemoryUnit, label: bool = True) -> str:
    """A unit's source turn as text: ``speaker: text``, as the dense turn baseline embeds a turn. ``label``
    False gives the text alone, as a store built with the retired ``source_turn_label`` off embedded it
    (``qgmem.older_records.stored_source_label``)."""
    return f"{unit.speaker}: {unit.source_text}" if unit.speaker and label else unit.source_text


def source_turn_embeddings(units: list[MemoryUnit], encoder, label: bool = True) -> np.ndarray:
    """One normalized embedding of each unit's source turn, ``[U, dim]``; each distinct turn encoded once."""
    texts = [source_turn_text(u, label) for u in units]
    if not texts:
        return np.zeros((0, int(getattr(encoder, "dim", 0))), dtype=np.float32)
    distinct = list(dict.fromkeys(texts))
    vectors = np.asarray(encoder.encode(distinct), dtype=np.float32)
    row = {t: i for i, t in enumerate(distinct)}
    return np.ascontiguousarray(vectors[[row[t] for t in texts]])
