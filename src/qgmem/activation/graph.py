"""The local memory graph over the working memory, and its PyG form for the graph encoder.

The graph exists only for one query: nodes are the subjects and objects of the activated units'
triples, edges their predicates (a unit's main triple and its further ``relations``). Building it
touches each unit once (O(k)), so its size is bounded by the working-memory budget (≤ 5k edges with at
most 4 further relations per unit, ≤ 2 nodes per edge before de-duplication) whatever the history length.
"""

from __future__ import annotations

import hashlib

from typing import Sequence

import numpy as np
import torch
from torch_geometric.data import Data

from qgmem.activation.channels import normalize_name
from qgmem.activation.records import LocalGraph
from qgmem.memory.records import MemoryUnit
from qgmem.model.graph_modes import empty_graph

def build_local_graph(units: list[MemoryUnit]) -> LocalGraph:
    """One directed edge ``subject -[predicate]-> object`` per unit triple, in working-memory order.

    A unit's further ``relations`` (the parser extractor's ``[head, relation, tail]``) add edges after
    its main one; every edge of a unit carries that unit's position in ``edge_unit``.

    Nodes are de-duplicated by normalized text (the first surface form is kept). A unit with an empty
    subject or object contributes no edge (an edge needs two ends); one with an empty predicate gets
    the label ``related to``.
    """
    graph = LocalGraph()
    ids: dict[str, int] = {}

    def node(text: str) -> int:
        key = normalize_name(text)
        if key not in ids:
            ids[key] = len(graph.node_text)
            graph.node_text.append(text.strip())
        return ids[key]

    for position, unit in enumerate(units):
        triples = [(unit.subject, unit.predicate, unit.object), *(tuple(r) for r in unit.relations if len(r) == 3)]
        for subject, predicate, obj in triples:
            if not normalize_name(subject) or not normalize_name(obj):
                continue
            head, tail = node(subject), node(obj)
            graph.edge_index.append((head, tail))
            graph.edge_text.append(predicate.strip() or "related to")
            graph.edge_unit.append(position)
    return graph


def graph_to_data(graph: LocalGraph, encoder, *, facts: Sequence[str] | None = None) -> Data:
    """``Data(x [N, dim], edge_index [2, E], edge_attr [E, dim], edge_unit [E])`` plus ``node_text``/``edge_text``.

    Node and edge features are frozen sentence embeddings of the node text and predicate text. With
    ``facts`` (the working memory's unit facts, in its order) the graph also carries ``edge_fact
    [E, dim]``: the embedding of the fact of the unit each edge comes from, the memory content that
    node and predicate texts leave out. An empty working memory still yields a valid graph, one
    all-zero node and no edges, because the encoder pools over at least one node.
    """
    dim = int(encoder.dim)
    if graph.num_nodes == 0:
        empty = empty_graph(dim, facts=facts is not None)
        empty.node_text, empty.edge_text = [""], []
        return empty
    x = torch.from_numpy(np.ascontiguousarray(encoder.encode(graph.node_text), dtype=np.float32))
    if graph.num_edges:
        edge_index = torch.tensor(graph.edge_index, dtype=torch.long).t().contiguous()
        edge_attr = torch.from_numpy(np.ascontiguousarray(encoder.encode(graph.edge_text), dtype=np.float32))
    else:
        edge_index = torch.zeros((2, 0), dtype=torch.long)
        edge_attr = torch.zeros((0, dim), dtype=torch.float32)
    extra = {} if facts is None else {"edge_fact": fact_features(graph, facts, encoder)}
    return Data(
        x=x,
        edge_index=edge_index,
        edge_attr=edge_attr,
        edge_unit=torch.tensor(graph.edge_unit, dtype=torch.long),
        node_text=list(graph.node_text),
        edge_text=list(graph.edge_text),
        num_nodes=graph.num_nodes,
        **extra,
    )


def fact_features(graph: LocalGraph, facts: Sequence[str], encoder) -> torch.Tensor:
    """``[E, dim]``: row ``j`` is the embedding of ``facts[graph.edge_unit[j]]`` (each fact encoded once)."""
    dim = int(encoder.dim)
    if not graph.edge_unit:
        return torch.zeros((0, dim), dtype=torch.float32)
    if max(graph.edge_unit) >= len(facts):
        raise ValueError(f"the local graph has edges from working-memory entry {max(graph.edge_unit) + 1}, "
                         f"but only {len(facts)} facts were given")
    used = sorted(set(graph.edge_unit))
    table = np.zeros((max(used) + 1, dim), dtype=np.float32)
    table[used] = np.asarray(encoder.encode([facts[i] for i in used]), dtype=np.float32)
    return torch.from_numpy(np.ascontiguousarray(table[graph.edge_unit]))


def graph_signature(graph) -> str:
    """A digest of everything the encoder reads from a graph: equal digests give equal tokens."""
    digest = hashlib.sha1()
    for name in ("x", "edge_index", "edge_attr", "edge_fact"):
        value = getattr(graph, name, None)
        if value is None:
            digest.update(f"{name}:none".encode())
            continue
        array = value.detach().cpu().contiguous().numpy()
        digest.update(f"{name}:{array.dtype}:{array.shape}".encode())
        digest.update(array.tobytes())
    return digest.hexdigest()
