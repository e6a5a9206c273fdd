"""The trainable part of QGMem: graph encoder + readout + projector → ``K`` graph tokens per local graph.

This module needs only torch and PyG, so serving can load an export without Lightning or the training
code; its config round-trips through ``config.json`` (an export written before ``features``/``readout``
existed loads as the paper's ``text`` features and ``mean`` readout).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import torch
from torch import nn

from qgmem.model.encoder import EncoderConfig, RelationalGraphEncoder
from qgmem.model.features import compose, edge_width, needs_fact
from qgmem.model.projector import GraphProjector
from qgmem.model.readout import GraphReadout


@dataclass
class GraphTokenConfig:
    """Everything needed to rebuild the network: input widths, features, encoder shape, readout, LM hidden size.

    ``features``: which memory content the encoder reads (see :mod:`qgmem.model.features`).
    ``readout``: ``mean`` (one token) or ``queries`` (``num_queries`` tokens, see :mod:`qgmem.model.readout`).
    """

    feature_dim: int
    edge_dim: int
    lm_hidden: int
    encoder: EncoderConfig = field(default_factory=EncoderConfig)
    projector_hidden: int | None = None
    features: str = "text"
    readout: str = "mean"
    num_queries: int = 1

    def __post_init__(self) -> None:
        edge_width(self.features, self.edge_dim)  # validates the option
        if self.readout == "mean" and self.num_queries != 1:
            raise ValueError(f"readout 'mean' gives one token; num_queries must be 1, got {self.num_queries}")

    @property
    def num_tokens(self) -> int:
        return self.num_queries

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> GraphTokenConfig:
        d = dict(d)
        d["encoder"] = EncoderConfig(**d.get("encoder", {}))
        return cls(**d)


class GraphTokenNet(nn.Module):
    """Encode a (batched) local memory graph into ``[num_graphs, K, lm_hidden]`` graph tokens."""

    def __init__(self, config: GraphTokenConfig):
        super().__init__()
        self.config = config
        self.encoder = RelationalGraphEncoder(config.feature_dim, edge_width(config.features, config.edge_dim),
                                              config.encoder)
        self.readout = GraphReadout(config.readout, config.encoder.hidden, config.num_queries, config.encoder.heads)
        self.projector = GraphProjector(config.encoder.hidden, config.lm_hidden, config.projector_hidden)

    def forward(self, graph) -> torch.Tensor:
        """``graph``: a PyG ``Data`` or ``Batch`` with ``x``, ``edge_index``, ``edge_attr`` (and ``edge_fact``
        when the features need it)."""
        batch = getattr(graph, "batch", None)
        num_graphs = int(graph.num_graphs) if batch is not None else 1
        if batch is None:
            batch = torch.zeros(graph.x.size(0), dtype=torch.long, device=graph.x.device)
        edge_attr = graph.edge_attr
        if edge_attr is None:  # a graph without edges may come without an edge_attr tensor
            edge_attr = graph.x.new_zeros((0, self.config.edge_dim))
        edge_fact = getattr(graph, "edge_fact", None) if needs_fact(self.config.features) else None
        if edge_fact is None and edge_attr.size(0) == 0 and needs_fact(self.config.features):
            edge_fact = edge_attr
        x, edge_attr = compose(self.config.features, graph.x, graph.edge_index, edge_attr, edge_fact)
        h = self.encoder.node_states(x, graph.edge_index, edge_attr)
        return self.projector(self.readout(h, batch, num_graphs))
