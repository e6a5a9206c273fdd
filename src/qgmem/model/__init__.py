"""The graph-token model: relation-aware graph encoder, readout, projector and graph-text fusion (no Lightning)."""

from qgmem.model.encoder import EncoderConfig, RelationalGraphEncoder
from qgmem.model.features import GRAPH_FEATURES
from qgmem.model.graph_token import GraphTokenConfig, GraphTokenNet
from qgmem.model.projector import GraphProjector
from qgmem.model.readout import READOUTS, GraphReadout

__all__ = ["GRAPH_FEATURES", "READOUTS", "EncoderConfig", "GraphProjector", "GraphReadout", "GraphTokenConfig",
           "GraphTokenNet", "RelationalGraphEncoder"]
