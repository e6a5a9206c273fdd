"""Graph readout: node states ``[N, C]`` → ``K`` summary vectors per graph ``[G, K, C]``.

- ``mean`` (the paper): one mean-pooled vector, ``K = 1``.
- ``queries`` (an extension): ``K`` learned queries attend over each graph's nodes (PyG's
  ``SetTransformerAggregation`` with only its pooling-by-multihead-attention block), giving ``K``
  graph tokens. One mean-pooled token is a known bottleneck for graph-to-LLM projection: several
  queries can each pick out different units of the working memory.
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import nn
from torch_geometric.nn import global_mean_pool
from torch_geometric.nn.aggr import SetTransformerAggregation

Readout = Literal["mean", "queries"]
READOUTS: tuple[str, ...] = ("mean", "queries")


class GraphReadout(nn.Module):
    """``forward(h, batch, num_graphs) -> [num_graphs, K, C]``."""

    def __init__(self, kind: str, channels: int, num_queries: int = 1, heads: int = 1):
        super().__init__()
        if kind not in READOUTS:
            raise ValueError(f"readout must be one of {READOUTS}, got {kind!r}")
        if num_queries < 1 or (kind == "mean" and num_queries != 1):
            raise ValueError(f"readout {kind!r} cannot give {num_queries} tokens (mean gives 1, queries >= 1)")
        self.kind, self.num_queries = kind, num_queries
        self.attend = None
        if kind == "queries":
            self.attend = SetTransformerAggregation(channels, num_seed_points=num_queries, num_encoder_blocks=0,
                                                    num_decoder_blocks=0, heads=heads, concat=True, layer_norm=True)

    def forward(self, h: torch.Tensor, batch: torch.Tensor, num_graphs: int) -> torch.Tensor:
        if self.attend is None:
            return global_mean_pool(h, batch, size=num_graphs).unsqueeze(1)
        out = self.attend(h, batch, dim_size=num_graphs)  # [G, K * C]; PyG batches keep ``batch`` sorted
        return out.view(num_graphs, self.num_queries, h.size(-1))
