from __future__ import annotations

import random

import pytest
import torch
from torch_geometric.data import Batch

from qgmem.activation.graph import build_local_graph, graph_to_data
from qgmem.activation.records import LocalGraph

from .helpers import make_unit


def _random_units(k: int, seed: int):
    rng = random.Random(seed)
    names = ["Caroline", "caroline", "Melanie", "the lake", "Boston", "pottery", "Sweden"]
    return [make_unit(f"u{i}", f"fact {i}", rng.choice(names), rng.choice(["likes", "visited", ""]),
                      rng.choice(names), [f"t{i}"]) for i in range(k)]


@pytest.mark.parametrize("k", [1, 3, 10, 25])
@pytest.mark.parametrize("seed", [0, 1])
def test_graph_bounds_and_dedup(k, seed):
    units = _random_units(k, seed)
    graph = build_local_graph(units)
    assert graph.num_edges <= k and graph.num_nodes <= 2 * k
    assert graph.num_edges == k  # every random unit has both ends
    keys = [t.lower() for t in graph.node_text]
    assert len(keys) == len(set(keys))  # "Caroline" and "caroline" are one node
    assert graph.edge_unit == list(range(k))  # working-memory order
    assert all(label for label in graph.edge_text)  # empty predicates are labelled


def test_graph_structure_of_known_units(small_store):
    units = [small_store.unit(u) for u in ("u3", "u4", "u6")]
    graph = build_local_graph(units)
    assert graph.node_text == ["Melanie", "nurse", "pottery teacher", "Melanie's kids", "camping"]
    assert graph.edge_index == [(0, 1), (0, 2), (3, 4)]
    assert graph.edge_text == ["works as", "works as", "love"]


def test_unit_without_object_adds_no_edge():
    units = [make_unit("a", "x", "Jon", "smiled", "", ["t1"]), make_unit("b", "y", "Jon", "met", "Gina", ["t2"])]
    graph = build_local_graph(units)
    assert graph.num_edges == 1 and graph.edge_unit == [1] and graph.node_text == ["Jon", "Gina"]


def test_further_relations_of_a_unit_are_edges_of_that_unit():
    moved = make_unit("a", "User moved to Denver with User's sister.", "User", "moved to", "Denver", ["t1"])
    moved.relations = [["Denver", "move with", "User's sister"], ["Anna", "is", "User's sister"], ["x", "", ""]]
    owns = make_unit("b", "Cooper found a squirrel.", "Cooper", "found", "squirrel", ["t2"])
    graph = build_local_graph([moved, owns])
    assert graph.node_text == ["User", "Denver", "User's sister", "Anna", "Cooper", "squirrel"]
    assert graph.edge_index == [(0, 1), (1, 2), (3, 2), (4, 5)]
    assert graph.edge_text == ["moved to", "move with", "is", "found"]
    assert graph.edge_unit == [0, 0, 0, 1]  # an incomplete triple adds nothing


def test_graph_to_data_shapes_and_features(small_store, hash_encoder):
    graph = build_local_graph(small_store.units)
    data = graph_to_data(graph, hash_encoder)
    n, e = graph.num_nodes, graph.num_edges
    assert data.x.shape == (n, 64) and data.x.dtype == torch.float32
    assert data.edge_index.shape == (2, e) and data.edge_index.dtype == torch.long
    assert data.edge_attr.shape == (e, 64) and data.edge_attr.dtype == torch.float32
    assert data.num_nodes == n and data.node_text == graph.node_text
    torch.testing.assert_close(data.x[0], torch.from_numpy(hash_encoder.encode([graph.node_text[0]])[0]))
    torch.testing.assert_close(data.edge_attr[1], torch.from_numpy(hash_encoder.encode([graph.edge_text[1]])[0]))


def test_empty_working_memory_gives_one_zero_node(hash_encoder):
    data = graph_to_data(LocalGraph(), hash_encoder)
    assert data.x.shape == (1, 64) and not data.x.any()
    assert data.edge_index.shape == (2, 0) and data.edge_attr.shape == (0, 64)
    assert data.num_nodes == 1 and data.node_text == [""] and data.edge_text == []


def test_graphs_batch_with_pyg(small_store, hash_encoder):
    a = graph_to_data(build_local_graph(small_store.units[:3]), hash_encoder)
    b = graph_to_data(LocalGraph(), hash_encoder)
    batch = Batch.from_data_list([a, b])
    assert batch.num_graphs == 2 and batch.x.shape[0] == a.num_nodes + 1
    assert batch.edge_index.max().item() < a.num_nodes  # offsets applied, empty graph adds no edges
    assert batch.node_text == [a.node_text, [""]]


def test_fact_features_follow_each_edge_unit(small_store, hash_encoder):
    units = small_store.units[:4]
    graph = build_local_graph(units)
    data = graph_to_data(graph, hash_encoder, facts=[u.fact for u in units])
    assert data.edge_fact.shape == data.edge_attr.shape == (data.edge_index.shape[1], 64)
    for j, position in enumerate(data.edge_unit.tolist()):
        torch.testing.assert_close(data.edge_fact[j], torch.from_numpy(hash_encoder.encode([units[position].fact])[0]))
    assert not hasattr(graph_to_data(graph, hash_encoder), "edge_fact") or graph_to_data(graph, hash_encoder).edge_fact is None


def test_fact_features_need_every_edge_unit(small_store, hash_encoder):
    graph = build_local_graph(small_store.units[:3])
    with pytest.raises(ValueError, match="only 1 facts were given"):
        graph_to_data(graph, hash_encoder, facts=[small_store.units[0].fact])
    empty = graph_to_data(LocalGraph(), hash_encoder, facts=[])
    assert empty.edge_fact.shape == (0, 64)
