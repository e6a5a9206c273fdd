"""Random contract items (graph + texts) for model-side tests and benchmarks that must not build memory."""

from __future__ import annotations

from typing import Any, Sequence

import torch


def synthetic_items(n: int, feature_dim: int = 8, *, seed: int = 0, max_nodes: int = 5,
                    categories: Sequence[str] = ("user_evidence", "changing_evidence")) -> list[dict[str, Any]]:
    """``n`` seeded items in the data↔model contract: ``Data(x [N, D], edge_index [2, E], edge_attr [E, D])``
    plus one short ``node_text`` per node (the targets of the node-token alignment)."""
    from torch_geometric.data import Data

    gen = torch.Generator().manual_seed(seed)
    fact_gen = torch.Generator().manual_seed(seed + 7919)  # its own stream: the graphs do not depend on it
    items = []
    for i in range(n):
        nodes = int(torch.randint(1, max_nodes + 1, (1,), generator=gen))
        edges = int(torch.randint(0, 2 * nodes, (1,), generator=gen))
        graph = Data(x=torch.randn(nodes, feature_dim, generator=gen),
                     edge_index=torch.randint(0, nodes, (2, edges), generator=gen),
                     edge_attr=torch.randn(edges, feature_dim, generator=gen),
                     edge_fact=torch.randn(edges, feature_dim, generator=fact_gen))
        color = ["green", "blue", "red", "amber"][i % 4]
        names = ["user", color, "hot leads", "the spreadsheet", "Monday"]
        node_text = [names[j] if j < len(names) else f"entity {j}" for j in range(nodes)]
        items.append({"graph": graph, "memory_text": f"[M1] The user marks hot leads {color} in the spreadsheet.",
                      "question": "Which color marks hot leads?", "answer": color.capitalize(),
                      "category": categories[i % len(categories)], "qa_id": f"synthetic#{i}", "node_text": node_text})
    return items


#: answer words of the protocol's controls (one node's text is the answer)
CONTROL_WORDS = ("giraffe", "penguin", "violin", "tomato", "pyramid", "glacier", "lantern", "mango", "saxophone",
                 "cactus", "dolphin", "volcano", "umbrella", "zebra", "pumpkin", "telescope", "walrus", "kimono",
                 "avocado", "harmonica", "igloo", "flamingo", "tornado", "octopus")
_FILLER = ("the user", "a note", "the list", "Tuesday", "the office", "a call", "the team", "a plan")


def control_items(n: int, feature_dim: int = 8, *, kind: str = "positive", seed: int = 0,
                  filler_nodes: int = 3) -> list[dict[str, Any]]:
    """The learning check's controls: items whose answer is one node's text, each with an ablated graph.

    Every graph holds one *answer node* plus ``filler_nodes`` filler nodes (random features, words
    unrelated to the question); its ``ablated_graph`` is the same graph with the answer node's text
    and features replaced by another word's, so the two graphs have the same size and shape.

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
    items = []
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
        items.append({"graph": graph, "node_text": [own_word, *fillers], "ablated_graph": ablated,
                      "ablated_node_text": [ablated_word, *fillers], "memory_text": "",
                      "question": "Which word did the user choose as the secret word?", "answer": answer,
                      "category": kind, "qa_id": f"control-{kind}#{i}"})
    return items


__all__ = ["CONTROL_WORDS", "control_items", "synthetic_items"]
