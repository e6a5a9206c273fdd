"""Relation-aware graph encoder over the local memory graph (paper §III-C, "Graph Encoding").

Node features are sentence embeddings of subjects/objects; edge features are sentence embeddings of
predicates. ``TransformerConv`` with ``edge_dim`` lets the predicate embedding enter both the attention
score and the message, which is what makes the message passing *relation-aware*.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch
from torch import nn
from torch_geometric.nn import TransformerConv, global_mean_pool


@dataclass
class EncoderConfig:
    """Shape of the graph encoder; the input widths come from the sentence encoder (``feature_dim``)."""

    hidden: int = 256  # node width inside the encoder; must be divisible by ``heads``
    heads: int = 4
    layers: int = 2
    dropout: float = 0.1
    attention_dropout: float = 0.0

    def __post_init__(self) -> None:
        if self.hidden % self.heads:
            raise ValueError(f"encoder.hidden ({self.hidden}) must be divisible by encoder.heads ({self.heads})")
        if self.layers < 1:
            raise ValueError(f"encoder.layers must be >= 1, got {self.layers}")

    def to_dict(self) -> dict:
        return asdict(self)


class RelationalGraphEncoder(nn.Module):
    """``L`` × (TransformerConv with predicate edge features → residual → LayerNorm); ``forward`` mean-pools."""

    def __init__(self, feature_dim: int, edge_dim: int, config: EncoderConfig):
        super().__init__()
        self.config = config
        self.input = nn.Linear(feature_dim, config.hidden)
        self.convs = nn.ModuleList(
            TransformerConv(config.hidden, config.hidden // config.heads, heads=config.heads, concat=True,
                            edge_dim=edge_dim, dropout=config.attention_dropout, root_weight=True)
            for _ in range(config.layers)
        )
        self.norms = nn.ModuleList(nn.LayerNorm(config.hidden) for _ in range(config.layers))
        self.dropout = nn.Dropout(config.dropout)
        self.act = nn.GELU()

    def node_states(self, x: torch.Tensor, edge_index: torch.Tensor, edge_attr: torch.Tensor) -> torch.Tensor:
        """Node features ``[N, D]``, edges ``[2, E]`` with features ``[E, edge_dim]`` → node states ``[N, hidden]``."""
        h = self.act(self.input(x))
        for conv, norm in zip(self.convs, self.norms):
            h = norm(h + self.dropout(self.act(conv(h, edge_index, edge_attr))))
        return h

    def forward(self, x: torch.Tensor, edge_index: torch.Tensor, edge_attr: torch.Tensor,
                batch: torch.Tensor | None = None, num_graphs: int | None = None) -> torch.Tensor:
        """Node states mean-pooled per graph: ``[num_graphs, hidden]`` (the paper's readout)."""
        h = self.node_states(x, edge_index, edge_attr)
        if batch is None:
            batch = torch.zeros(h.size(0), dtype=torch.long, device=h.device)
            num_graphs = 1
        return global_mean_pool(h, batch, size=num_graphs)
