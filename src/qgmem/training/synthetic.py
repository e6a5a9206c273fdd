"""Random contract items (graph + texts) for model-side tests and benchmarks that must not build memory."""

from __future__ import annotations

from typing import Any, Sequence

import torch

SYNTHETIC_UNITS = 3  # working-memory positions the synthetic edges are drawn from


def synthetic_items(n: int, feature_dim: int = 8, *, seed: int = 0, max_nodes: int = 5,
                    categories: Sequence[str] = ("user_evidence", "changing_evidence")) -> list[dict[str, Any]]:
    """``n`` seeded items in the data↔model contract: ``Data(x [N, D], edge_index [2, E], edge_attr [E, D],
    edge_unit [E])`` plus one short ``node_text`` per node (the targets of the node-token alignment)."""
    from torch_geometric.data import Data

    gen = torch.Generator().manual_seed(seed)
    fact_gen = torch.Generator().manual_seed(seed + 7919)  # its own stream: the graphs do not depend on it
    unit_gen = torch.Generator().manual_seed(seed + 104729)  # the edges' working-memory units, likewise
    items = []
    for i in range(n):
        nodes = int(torch.randint(1, max_nodes + 1, (1,), generator=gen))
        edges = int(torch.randint(0, 2 * nodes, (1,), generator=gen))
        graph = Data(x=torch.randn(nodes, feature_dim, generator=gen),
                     edge_index=torch.randint(0, nodes, (2, edges), generator=gen),
                     edge_attr=torch.randn(edges, feature_dim, generator=gen),
                     edge_fact=torch.randn(edges, feature_dim, generator=fact_gen),
                     edge_unit=torch.randint(0, SYNTHETIC_UNITS, (edges,), generator=unit_gen))
        color = ["green", "blue", "red", "amber"][i % 4]
        names = ["user", color, "hot leads", "the spreadsheet", "Monday"]
        node_text = [names[j] if j < len(names) else f"entity {j}" for j in range(nodes)]
        items.append({"graph": graph, "memory_text": f"[M1] The user marks hot leads {color} in the spreadsheet.",
                      "question": "Which color marks hot leads?", "answer": color.capitalize(),
                      "category": categories[i % len(categories)], "qa_id": f"synthetic#{i}", "node_text": node_text})
    return items


__all__ = ["synthetic_items"]
