"""The graph-token model: relation-aware graph encoder, readout, projector, graph-text fusion and the per-layer
key/value prefix (no Lightning).

The names below load on first use, so a light module of the package (``graph_modes``' list of modes,
read by the commands' flags) is imported without torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from qgmem.model.encoder import EncoderConfig, RelationalGraphEncoder
    from qgmem.model.features import GRAPH_FEATURES
    from qgmem.model.graph_token import GraphTokenConfig, GraphTokenNet
    from qgmem.model.kv_prefix import INJECTIONS, KVPrefix, KVProjector
    from qgmem.model.projector import GraphProjector
    from qgmem.model.readout import READOUTS, GraphReadout

#: name -> the module that defines it
_WHERE = {"EncoderConfig": "encoder", "RelationalGraphEncoder": "encoder", "GRAPH_FEATURES": "features",
          "GraphTokenConfig": "graph_token", "GraphTokenNet": "graph_token", "GraphProjector": "projector",
          "READOUTS": "readout", "GraphReadout": "readout", "INJECTIONS": "kv_prefix", "KVPrefix": "kv_prefix",
          "KVProjector": "kv_prefix"}
__all__ = sorted(_WHERE)


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_WHERE[name]}"), name)
