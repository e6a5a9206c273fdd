"""Graph readout: node states ``[N, C]`` → ``K`` summary vectors per graph ``[G, K, C]``.

- ``mean`` (the paper): one mean-pooled vector, ``K = 1``.
- ``queries`` (an extension): ``K`` learned queries attend over each graph's nodes (PyG's
  ``SetTransformerAggregation`` with only its pooling-by-multihead-attention block), giving ``K``
  graph tokens. One mean-pooled token is a known bottleneck for graph-to-LLM projection: several
  queries can each pick out different units of the working memory.
- ``nodes`` (an extension): the states of the graph's first ``K`` nodes, one token each. Nodes come in
  working-memory order (the best-ranked unit's subject and object first), so the cut keeps the most
  relevant ones; a graph with fewer nodes fills its last slots with one learned vector. Each token is
  a single node's relation-aware state, which the projector can map near the LM's own word embedding
  of that node (see :mod:`qgmem.model.alignment`): a small frozen LM reads such tokens as words.
- ``summary_nodes`` (an extension): the paper's mean-pooled token first, then the first ``K - 1``
  nodes as above. The node tokens carry the graph's words; the summary token is free to carry what
  the answer loss wants of every sample alike (the answer style a soft prompt learns), so the node
  tokens need not.
- ``summary_units`` (an extension): the paper's mean-pooled token first, then one token per
  working-memory unit, positions ``0 .. K - 2`` in reranked order. A unit's state is the mean over the
  unit's edges (each edge carries its unit's position, ``edge_unit``) of the mean of the edge's head and
  tail node states; a position without a unit (fewer units than ``K - 1``, or a unit whose triple had
  an empty end and so no edge) gets one learned fill vector. The graph tokens then grow linearly with
  the units the graph holds: ``K = 1 + k_graph`` for a graph over ``k_graph`` units (11 at 10 units),
  where ``summary_nodes`` gives ``1 + `` its node count whatever the units (17 by default).
"""

from __future__ import annotations

from typing import Literal, get_args

import torch
from torch import nn
from torch_geometric.nn import global_mean_pool
from torch_geometric.nn.aggr import SetTransformerAggregation
from torch_geometric.utils import scatter, to_dense_batch

from qgmem.model.graph_modes import UNKNOWN_UNIT

Readout = Literal["mean", "queries", "nodes", "summary_nodes", "summary_units"]
READOUTS: tuple[str, ...] = get_args(Readout)
NODE_READOUTS = ("nodes", "summary_nodes")
FILLED_READOUTS = (*NODE_READOUTS, "summary_units")  # readouts with a learned fill vector for empty slots


def check_readout(kind: str, num_graph_tokens: int) -> None:
    """The one rule for which readout gives how many tokens; a ``ValueError`` naming both otherwise."""
    if kind not in READOUTS:
        raise ValueError(f"readout must be one of {READOUTS}, got {kind!r}")
    least = 2 if kind.startswith("summary_") else 1
    if num_graph_tokens < least or (kind == "mean" and num_graph_tokens != 1):
        raise ValueError(f"readout {kind!r} cannot give {num_graph_tokens} tokens (mean gives 1, queries/nodes >= 1, "
                         "summary_nodes/summary_units >= 2)")


class GraphReadout(nn.Module):
    """``forward(h, batch, num_graphs, edge_index, edge_unit) -> [num_graphs, K, C]`` (the edges are read by
    ``summary_units`` only)."""

    def __init__(self, kind: str, channels: int, num_graph_tokens: int = 1, heads: int = 1):
        super().__init__()
        check_readout(kind, num_graph_tokens)
        self.kind, self.num_graph_tokens = kind, num_graph_tokens
        self.attend = None
        self.fill = nn.Parameter(torch.zeros(channels)) if kind in FILLED_READOUTS else None
        if kind == "queries":
            self.attend = SetTransformerAggregation(channels, num_seed_points=num_graph_tokens, num_encoder_blocks=0,
                                                    num_decoder_blocks=0, heads=heads, concat=True, layer_norm=True)

    def forward(self, h: torch.Tensor, batch: torch.Tensor, num_graphs: int, edge_index: torch.Tensor | None = None,
                edge_unit: torch.Tensor | None = None) -> torch.Tensor:
        if self.kind == "summary_units":
            units = self.units(h, batch, num_graphs, edge_index, edge_unit)
            return torch.cat([global_mean_pool(h, batch, size=num_graphs).unsqueeze(1), units], 1)
        if self.kind in NODE_READOUTS:  # PyG batches keep each graph's nodes contiguous and in their own order
            k = self.num_graph_tokens - (self.kind == "summary_nodes")
            dense, present = to_dense_batch(h, batch, batch_size=num_graphs, max_num_nodes=k)
            if dense.size(1) < k:
                dense = torch.cat([dense, dense.new_zeros(num_graphs, k - dense.size(1), h.size(-1))], 1)
                present = torch.cat([present, present.new_zeros(num_graphs, k - present.size(1))], 1)
            nodes = torch.where(present.unsqueeze(-1), dense, self.fill.to(dense.dtype))
            if self.kind == "nodes":
                return nodes
            return torch.cat([global_mean_pool(h, batch, size=num_graphs).unsqueeze(1), nodes], 1)
        if self.attend is None:
            return global_mean_pool(h, batch, size=num_graphs).unsqueeze(1)
        out = self.attend(h, batch, dim_size=num_graphs)  # [G, K * C]; PyG batches keep ``batch`` sorted
        return out.view(num_graphs, self.num_graph_tokens, h.size(-1))

    def units(self, h: torch.Tensor, batch: torch.Tensor, num_graphs: int, edge_index: torch.Tensor | None,
              edge_unit: torch.Tensor | None) -> torch.Tensor:
        """``[num_graphs, K - 1, C]``: unit ``u`` of graph ``g`` is the mean over its edges of (head + tail) / 2."""
        k = self.num_graph_tokens - 1
        if edge_index is None:
            edge_index = batch.new_zeros((2, 0))
        if edge_unit is None and edge_index.size(1) == 0:
            edge_unit = batch.new_zeros(0)
        if edge_unit is None or edge_unit.numel() != edge_index.size(1) or bool((edge_unit == UNKNOWN_UNIT).any()):
            raise ValueError("readout 'summary_units' needs each edge's working-memory unit (the graph's edge_unit); "
                             "these graphs do not record it")
        edge_unit = edge_unit.to(batch.device).long()
        kept = edge_unit < k  # units past the K - 1 slots only reach the pooled token
        head, tail = edge_index[0][kept], edge_index[1][kept]
        slot = batch[head] * k + edge_unit[kept]  # PyG batches do not offset edge_unit: it stays per graph
        states = scatter((h[head] + h[tail]) / 2, slot, dim=0, dim_size=num_graphs * k, reduce="mean")
        present = scatter(torch.ones_like(slot), slot, dim=0, dim_size=num_graphs * k, reduce="sum") > 0
        states = torch.where(present.unsqueeze(-1), states, self.fill.to(states.dtype))
        return states.view(num_graphs, k, h.size(-1))
