"""The protocol's positive and negative controls: synthetic items whose answer is, or is not, one node's text.

Why: before the ablated contrast is read on real data, it must be shown to move when a graph does carry
the answer (positive) and to stay at 0 when none does (negative), on graphs that differ in one node only.
"""

from __future__ import annotations

from typing import Any

import torch

#: answer words of the protocol's controls (one node's text is the answer)
CONTROL_WORDS = ("giraffe", "penguin", "violin", "tomato", "pyramid", "glacier", "lantern", "mango", "saxophone",
                 "cactus", "dolphin", "volcano", "umbrella", "zebra", "pumpkin", "telescope", "walrus", "kimono",
                 "avocado", "harmonica", "igloo", "flamingo", "tornado", "octopus")
_FILLER = ("the user", "a note", "the list", "Tuesday", "the office", "a call", "the team", "a plan")


def control_items(n: int, feature_dim: int = 8, *, kind: str = "positive", seed: int = 0,
                  filler_nodes: int = 3) -> tuple[list[dict[str, Any]], dict[str, dict[str, Any]]]:
    """The learning check's controls: items whose answer is one node's text, and each one's ablated graph.

    Every graph holds one *answer node* plus ``filler_nodes`` filler nodes (random features, words
    unrelated to the question); its ablated graph is the same graph with the answer node's text and
    features replaced by another word's, so the two graphs have the same size and shape. Returns the
    items and ``qa_id -> {ablated_graph, ablated_node_text}``, as
    :func:`qgmem.evaluation.counterfactuals.load` gives them for a cache.

    - ``positive``: the answer node's text is the answer (graph-only own − ablated must be strongly
      negative for any model that can read node texts);
    - ``negative``: random node features: the answer node holds a random word that is not the answer,
      so no graph carries the answer and own − ablated must be indistinguishable from 0.
    """
    from torch_geometric.data import Data

    if kind not in ("positive", "negative"):
        raise ValueError(f"kind must be 'positive' or 'negative', got {kind!r}")
    gen = torch.Generator().manual_seed(seed)
    words = list(CONTROL_WORDS)
    items, counterfactuals = [], {}
    for i in range(n):
        answer = words[i % len(words)]
        others = [w for w in words if w != answer]
        pick = lambda: others[int(torch.randint(0, len(others), (1,), generator=gen))]  # noqa: E731
        own_word = answer if kind == "positive" else pick()
        ablated_word = pick()
        while ablated_word == own_word:
            ablated_word = pick()
        fillers = [_FILLER[int(j)] for j in torch.randperm(len(_FILLER), generator=gen)[:filler_nodes]]
        nodes = 1 + len(fillers)
        edge_index = torch.tensor([[0] * len(fillers), list(range(1, nodes))], dtype=torch.long)
        x = torch.randn(nodes, feature_dim, generator=gen)
        edge_attr = torch.randn(len(fillers), feature_dim, generator=gen)
        edge_fact = torch.randn(len(fillers), feature_dim, generator=gen)
        graph = Data(x=x, edge_index=edge_index, edge_attr=edge_attr, edge_fact=edge_fact)
        ablated_x = x.clone()
        ablated_x[0] = torch.randn(feature_dim, generator=gen)
        ablated = Data(x=ablated_x, edge_index=edge_index.clone(), edge_attr=edge_attr.clone(),
                       edge_fact=edge_fact.clone())
        items.append({"graph": graph, "node_text": [own_word, *fillers], "memory_text": "",
                      "question": "Which word did the user choose as the secret word?", "answer": answer,
                      "category": kind, "qa_id": f"control-{kind}#{i}"})
        counterfactuals[f"control-{kind}#{i}"] = {"ablated_graph": ablated, "ablated_node_text": [ablated_word, *fillers]}
    return items, counterfactuals


__all__ = ["CONTROL_WORDS", "control_items"]
