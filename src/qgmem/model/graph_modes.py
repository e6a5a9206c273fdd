"""What the LM reads as the graph: its own (``token``), none (text only) or another sample's (``shuffled``).

One list of modes and one shuffling rule for training, the export's pipeline and the API backbone, so an
ablation means the same wherever it runs: sample ``i`` gets sample ``i + 1``'s graph (the last gets the
first's), and a sample alone gets the empty graph. The evaluation protocol's derangement
(:mod:`qgmem.evaluation.protocol`) is stricter on purpose: it also never pairs two identical graphs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal, Sequence, TypeVar, get_args

if TYPE_CHECKING:
    from torch_geometric.data import Data

GraphMode = Literal["token", "none", "shuffled"]
#: ``edge_unit`` of an edge whose working-memory unit was not recorded (a graph table written without it)
UNKNOWN_UNIT = -1
GRAPH_MODES: tuple[str, ...] = get_args(GraphMode)

T = TypeVar("T")


def shuffled(graphs: Sequence[T], alone: T) -> list[T]:
    """Each graph moved one place: position ``i`` holds ``graphs[i + 1]``; ``[alone]`` for a single one."""
    graphs = list(graphs)
    return graphs[1:] + graphs[:1] if len(graphs) > 1 else [alone] * len(graphs)


def check_mode(mode: str) -> str:
    """``mode`` when it is one of :data:`GRAPH_MODES`; a ``ValueError`` naming the modes otherwise."""
    if mode not in GRAPH_MODES:
        raise ValueError(f"graph_mode must be one of {', '.join(GRAPH_MODES)}, got {mode!r}")
    return mode


def empty_graph(feature_dim: int, edge_dim: int | None = None, facts: bool = False) -> Data:
    """The graph of an empty working memory: one all-zero node and no edges (the encoder pools over at
    least one node). The one home of that rule: the cache, the local graph, the export's encoder and the ablations use it.
    It carries an empty ``edge_unit``, so it batches with graphs that record their edges' units."""
    import torch
    from torch_geometric.data import Data

    edge_dim = feature_dim if edge_dim is None else edge_dim
    extra = {"edge_fact": torch.zeros((0, edge_dim), dtype=torch.float32)} if facts else {}
    return Data(x=torch.zeros((1, feature_dim), dtype=torch.float32), edge_index=torch.zeros((2, 0), dtype=torch.long),
                edge_attr=torch.zeros((0, edge_dim), dtype=torch.float32), edge_unit=torch.zeros(0, dtype=torch.long),
                num_nodes=1, **extra)
