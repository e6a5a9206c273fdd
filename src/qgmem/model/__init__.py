"""The graph-token model: relation-aware graph encoder, projector and graph-text fusion (no Lightning)."""

from qgmem.model.encoder import EncoderConfig, RelationalGraphEncoder
from qgmem.model.graph_token import GraphTokenConfig, GraphTokenNet
from qgmem.model.projector import GraphProjector

__all__ = ["EncoderConfig", "GraphProjector", "GraphTokenConfig", "GraphTokenNet", "RelationalGraphEncoder"]
