"""The ``summary_units`` readout: the pooled token, then one token per working-memory unit from its edges."""

from __future__ import annotations

import pytest
import torch
from torch_geometric.data import Batch, Data

from qgmem.model.graph_modes import UNKNOWN_UNIT, empty_graph
from qgmem.model.graph_token import GraphTokenConfig
from qgmem.model.readout import GraphReadout

C = 2
FILL = torch.tensor([-5.0, 5.0])


def readout(k: int = 4) -> GraphReadout:
    out = GraphReadout("summary_units", C, num_graph_tokens=k)
    with torch.no_grad():
        out.fill.copy_(FILL)
    return out


def data(h: torch.Tensor, edges: list[tuple[int, int]], units: list[int]) -> Data:
    edge_index = torch.tensor(edges, dtype=torch.long).t().reshape(2, -1)
    return Data(x=h, edge_index=edge_index, edge_unit=torch.tensor(units, dtype=torch.long), num_nodes=h.size(0))


def read(out: GraphReadout, graphs: list[Data]) -> torch.Tensor:
    batch = Batch.from_data_list(graphs)
    return out(batch.x, batch.batch, batch.num_graphs, batch.edge_index, batch.edge_unit)


H0 = torch.tensor([[0.0, 0.0], [2.0, 4.0], [4.0, 8.0], [10.0, 20.0]])
# unit 0 has two edges, unit 1 none (its triple had an empty end), unit 2 one, unit 5 lies past the K - 1 slots
G0 = data(H0, [(0, 1), (2, 3), (1, 2), (3, 0)], [0, 0, 2, 5])


def test_a_unit_is_the_mean_of_its_edges_head_tail_means_and_missing_units_get_the_fill():
    out = read(readout(4), [G0])
    assert out.shape == (1, 4, C)
    torch.testing.assert_close(out[0, 0], H0.mean(0))  # the paper's pooled token first
    edge_a, edge_b = (H0[0] + H0[1]) / 2, (H0[2] + H0[3]) / 2
    torch.testing.assert_close(out[0, 1], (edge_a + edge_b) / 2)  # unit 0: its two edges averaged
    torch.testing.assert_close(out[0, 2], FILL)  # unit 1: no edge
    torch.testing.assert_close(out[0, 3], (H0[1] + H0[2]) / 2)  # unit 2


def test_fewer_units_than_slots_are_filled_and_a_graph_without_edges_is_all_fill():
    out = read(readout(6), [G0, data(torch.ones(1, C), [], [])])
    assert out.shape == (2, 6, C)
    torch.testing.assert_close(out[0, 4], FILL)  # unit 3: none
    torch.testing.assert_close(out[0, 5], FILL)  # unit 4: none; unit 5 reaches no slot of K - 1 = 5
    torch.testing.assert_close(out[1, 0], torch.ones(C))
    torch.testing.assert_close(out[1, 1:], FILL.expand(5, C))


def test_a_batch_keeps_each_graph_s_units_apart():
    h1 = torch.tensor([[1.0, 1.0], [3.0, 5.0]])
    g1 = data(h1, [(1, 0)], [1])
    head = readout(4)
    together = read(head, [G0, g1])
    assert together.shape == (2, 4, C)
    torch.testing.assert_close(together[0], read(head, [G0])[0])
    torch.testing.assert_close(together[1], torch.stack([h1.mean(0), FILL, (h1[0] + h1[1]) / 2, FILL]))
    # unit positions are not offset by batching (edge_unit is no index attribute)
    assert Batch.from_data_list([G0, g1]).edge_unit.tolist() == [0, 0, 2, 5, 1]


def test_gradients_reach_the_node_states_of_unit_edges_and_the_fill():
    head = readout(4)
    h = H0.clone().requires_grad_(True)
    g = data(h, [(0, 1), (2, 3)], [0, 2])
    out = head(h, torch.zeros(4, dtype=torch.long), 1, g.edge_index, g.edge_unit)
    out[:, 1:].sum().backward()  # the unit slots only
    torch.testing.assert_close(h.grad, torch.full((4, C), 0.5))
    torch.testing.assert_close(head.fill.grad, torch.ones(C))  # unit 1 is filled


def test_edges_without_a_recorded_unit_are_refused():
    g = data(H0, [(0, 1)], [UNKNOWN_UNIT])
    with pytest.raises(ValueError, match="edge_unit"):
        read(readout(3), [g])
    with pytest.raises(ValueError, match="edge_unit"):
        readout(3)(H0, torch.zeros(4, dtype=torch.long), 1, g.edge_index, None)
    # the empty graph records its (no) units, so it batches with graphs that do
    known = Data(x=H0, edge_index=g.edge_index, edge_attr=torch.zeros(1, C), edge_unit=torch.tensor([1]), num_nodes=4)
    out = read(readout(3), [empty_graph(C), known])
    torch.testing.assert_close(out[:, 1:], torch.stack([FILL.expand(2, C), torch.stack([FILL, (H0[0] + H0[1]) / 2])]))


@pytest.mark.parametrize("k", [0, 1])
def test_the_config_refuses_too_few_tokens(k):
    with pytest.raises(ValueError, match="summary_units"):
        GraphTokenConfig(feature_dim=C, edge_dim=C, lm_hidden=4, features="text", readout="summary_units",
                         num_graph_tokens=k)
