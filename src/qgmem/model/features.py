"""Which memory content enters the graph encoder: node/predicate texts alone, or with the unit's fact.

The paper's message passing "propagates both memory content and typed relations", but node and predicate
texts alone ("user" -[prefers]-> "green") drop most of a unit's content. Each edge comes from one memory
unit, so the unit's fact embedding (``edge_fact``, ``[E, D]``, built next to ``edge_attr``) can be put on
its edge or on the edge's two end nodes:

- ``text``: the paper's features (node text, predicate text);
- ``edge_fact_sum``: edge features = predicate + fact (width ``D``);
- ``edge_fact_concat``: edge features = [predicate; fact] (width ``2D``);
- ``node_fact``: node features = node text + mean fact of the node's incident edges;
- ``node_words``: node features = [node text; the LM's own mean word embedding of the node text]
  (width ``D + lm_hidden``). A sentence embedding keeps what a text means but not which words it
  has, and a small frozen LM needs the words: mapped from MiniLM alone, node tokens reach only a
  relative error of ~0.4 against the word embeddings on unseen node texts (docs/BENCHMARKS.md). The
  word vectors are looked up in the frozen LM's input embeddings from the graph's ``node_word_ids``
  (:mod:`qgmem.model.alignment`), so they cost no storage and follow the LM.
"""

from __future__ import annotations

from typing import Literal

import torch
from torch_geometric.utils import scatter

GraphFeatures = Literal["text", "edge_fact_sum", "edge_fact_concat", "node_fact", "node_words"]
GRAPH_FEATURES: tuple[str, ...] = ("text", "edge_fact_sum", "edge_fact_concat", "node_fact", "node_words")


def check_features(option: str) -> str:
    if option not in GRAPH_FEATURES:
        raise ValueError(f"graph features must be one of {GRAPH_FEATURES}, got {option!r}")
    return option


def needs_fact(option: str) -> bool:
    """Whether the option reads the graph's ``edge_fact`` tensor."""
    return check_features(option) not in ("text", "node_words")


def needs_words(option: str) -> bool:
    """Whether the option reads the graph's ``node_word_ids`` (and the LM's input embeddings)."""
    return check_features(option) == "node_words"


def node_width(option: str, feature_dim: int, lm_hidden: int) -> int:
    """Width of the node features the encoder sees."""
    return feature_dim + lm_hidden if needs_words(option) else feature_dim


def edge_width(option: str, edge_dim: int) -> int:
    """Width of the edge features the encoder sees for a predicate width ``edge_dim``."""
    return 2 * edge_dim if check_features(option) == "edge_fact_concat" else edge_dim


def compose(option: str, x: torch.Tensor, edge_index: torch.Tensor, edge_attr: torch.Tensor,
            edge_fact: torch.Tensor | None, words: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Node and edge features ``(x [N, D or D + H], edge_attr [E, D or 2D])`` for ``option``
    (``words``: ``[N, H]`` word vectors, read by ``node_words`` only)."""
    if check_features(option) == "text":
        return x, edge_attr
    if option == "node_words":
        if words is None or words.size(0) != x.size(0):
            got = None if words is None else tuple(words.shape)
            raise ValueError(f"graph features 'node_words' need one word vector per node ({x.size(0)}), got {got}")
        return torch.cat([x, words.to(x.dtype)], dim=-1), edge_attr
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
