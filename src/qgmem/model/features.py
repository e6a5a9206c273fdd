"""Which memory content enters the graph encoder: node/predicate texts alone, or with the unit's fact.

The paper's message passing "propagates both memory content and typed relations", but node and predicate
texts alone ("user" -[prefers]-> "green") drop most of a unit's content. Each edge comes from one memory
unit, so the unit's fact embedding (``edge_fact``, ``[E, D]``, built next to ``edge_attr``) can be put on
its edge or on the edge's two end nodes:

- ``text``: the paper's features (node text, predicate text);
- ``edge_fact_sum``: edge features = predicate + fact (width ``D``);
- ``edge_fact_concat``: edge features = [predicate; fact] (width ``2D``);
- ``node_fact``: node features = node text + mean fact of the node's incident edges.
"""

from __future__ import annotations

from typing import Literal

import torch
from torch_geometric.utils import scatter

GraphFeatures = Literal["text", "edge_fact_sum", "edge_fact_concat", "node_fact"]
GRAPH_FEATURES: tuple[str, ...] = ("text", "edge_fact_sum", "edge_fact_concat", "node_fact")


def check_features(option: str) -> str:
    if option not in GRAPH_FEATURES:
        raise ValueError(f"graph features must be one of {GRAPH_FEATURES}, got {option!r}")
    return option


def needs_fact(option: str) -> bool:
    """Whether the option reads the graph's ``edge_fact`` tensor."""
    return check_features(option) != "text"


def edge_width(option: str, edge_dim: int) -> int:
    """Width of the edge features the encoder sees for a predicate width ``edge_dim``."""
    return 2 * edge_dim if check_features(option) == "edge_fact_concat" else edge_dim


def compose(option: str, x: torch.Tensor, edge_index: torch.Tensor, edge_attr: torch.Tensor,
            edge_fact: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """Node and edge features ``(x [N, D], edge_attr [E, D or 2D])`` for ``option``."""
    if check_features(option) == "text":
        return x, edge_attr
    if edge_fact is None or edge_fact.shape != edge_attr.shape:
        got = None if edge_fact is None else tuple(edge_fact.shape)
        raise ValueError(f"graph features {option!r} need edge_fact of shape {tuple(edge_attr.shape)} (one fact "
                         f"embedding per edge), got {got}: rebuild the data cache with this version")
    if option == "edge_fact_sum":
        return x, edge_attr + edge_fact
    if option == "edge_fact_concat":
        return x, torch.cat([edge_attr, edge_fact], dim=-1)
    ends = torch.cat([edge_index[0], edge_index[1]])  # node_fact: each edge's fact reaches both its ends
    mean_fact = scatter(torch.cat([edge_fact, edge_fact]), ends, dim=0, dim_size=x.size(0), reduce="mean")
    return x + mean_fact, edge_attr
