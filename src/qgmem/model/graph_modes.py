"""What the LM reads as the graph: its own (``token``), none (text only) or another sample's (``shuffled``).

One list of modes and one shuffling rule for training, the export's pipeline and the API backbone, so an
ablation means the same wherever it runs: sample ``i`` gets sample ``i + 1``'s graph (the last gets the
first's), and a sample alone gets the empty graph. The evaluation protocol's derangement
(:mod:`qgmem.training.protocol`) is stricter on purpose: it also never pairs two identical graphs.
"""

from __future__ import annotations

from typing import Literal, Sequence, TypeVar, get_args

GraphMode = Literal["token", "none", "shuffled"]
GRAPH_MODES: tuple[str, ...] = get_args(GraphMode)

T = TypeVar("T")


def shuffled(graphs: Sequence[T], alone: T) -> list[T]:
    """Each graph moved one place: position ``i`` holds ``graphs[i + 1]``; ``[alone]`` for a single one."""
    graphs = list(graphs)
    return graphs[1:] + graphs[:1] if len(graphs) > 1 else [alone] * len(graphs)


def check_mode(mode: str) -> str:
    """``mode`` when it is one of :data:`GRAPH_MODES`; a ``ValueError`` naming the modes otherwise."""
    if mode not in GRAPH_MODES:
        raise ValueError(f"graph must be one of {', '.join(GRAPH_MODES)}, got {mode!r}")
    return mode
