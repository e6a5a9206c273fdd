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
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import nn
from torch_geometric.nn import global_mean_pool
from torch_geometric.nn.aggr import SetTransformerAggregation
from torch_geometric.utils import to_dense_batch

Readout = Literal["mean", "queries", "nodes", "summary_nodes"]
READOUTS: tuple[str, ...] = ("mean", "queries", "nodes", "summary_nodes")
NODE_READOUTS = ("nodes", "summary_nodes")


class GraphReadout(nn.Module):
    """``forward(h, batch, num_graphs) -> [num_graphs, K, C]``."""

    def __init__(self, kind: str, channels: int, num_graph_tokens: int = 1, heads: int = 1):
        super().__init__()
        if kind not in READOUTS:
            raise ValueError(f"readout must be one of {READOUTS}, got {kind!r}")
        if num_graph_tokens < 1 or (kind == "mean" and num_graph_tokens != 1) or (kind == "summary_nodes" and num_graph_tokens < 2):
            raise ValueError(f"readout {kind!r} cannot give {num_graph_tokens} tokens (mean gives 1, queries/nodes >= 1, "
                             "summary_nodes >= 2)")
        self.kind, self.num_graph_tokens = kind, num_graph_tokens
        self.attend = None
        self.fill = nn.Parameter(torch.zeros(channels)) if kind in NODE_READOUTS else None
        if kind == "queries":
            self.attend = SetTransformerAggregation(channels, num_seed_points=num_graph_tokens, num_encoder_blocks=0,
                                                    num_decoder_blocks=0, heads=heads, concat=True, layer_norm=True)

    def forward(self, h: torch.Tensor, batch: torch.Tensor, num_graphs: int) -> torch.Tensor:
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
