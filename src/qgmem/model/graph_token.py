"""The trainable part of QGMem: graph encoder + projector → one graph token per local graph.

This module needs only torch and PyG, so serving can load an export without Lightning or the training
code; its config round-trips through ``config.json``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import torch
from torch import nn

from qgmem.model.encoder import EncoderConfig, RelationalGraphEncoder
from qgmem.model.projector import GraphProjector


@dataclass
class GraphTokenConfig:
    """Everything needed to rebuild the network: input widths, encoder shape, LM hidden size."""

    feature_dim: int
    edge_dim: int
    lm_hidden: int
    encoder: EncoderConfig = field(default_factory=EncoderConfig)
    projector_hidden: int | None = None

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> GraphTokenConfig:
        d = dict(d)
        d["encoder"] = EncoderConfig(**d.get("encoder", {}))
        return cls(**d)


class GraphTokenNet(nn.Module):
    """Encode a (batched) local memory graph into ``[num_graphs, lm_hidden]`` graph tokens."""

    def __init__(self, config: GraphTokenConfig):
        super().__init__()
        self.config = config
        self.encoder = RelationalGraphEncoder(config.feature_dim, config.edge_dim, config.encoder)
        self.projector = GraphProjector(config.encoder.hidden, config.lm_hidden, config.projector_hidden)

    def forward(self, graph) -> torch.Tensor:
        """``graph``: a PyG ``Data`` or ``Batch`` with ``x``, ``edge_index``, ``edge_attr``."""
        batch = getattr(graph, "batch", None)
        num_graphs = int(graph.num_graphs) if batch is not None else 1
        edge_attr = graph.edge_attr
        if edge_attr is None:  # a graph without edges may come without an edge_attr tensor
            edge_attr = graph.x.new_zeros((0, self.config.edge_dim))
        pooled = self.encoder(graph.x, graph.edge_index, edge_attr, batch, num_graphs)
        return self.projector(pooled)
