"""Graph encoder, projector and graph-token network: shapes, batching, relation awareness, config."""

from __future__ import annotations

import pytest
import torch
from torch_geometric.data import Batch, Data

from qgmem.model.alignment import PAD_PIECE
from qgmem.model.features import needs_fact
from qgmem.model import (GRAPH_FEATURES, EncoderConfig, GraphProjector, GraphReadout, GraphTokenConfig, GraphTokenNet,
                         RelationalGraphEncoder)

D = 6
READOUTS = [("mean", 1), ("queries", 1), ("queries", 3), ("nodes", 4), ("summary_nodes", 5), ("summary_units", 4)]
VOCAB = 20
WORDS = torch.randn(VOCAB, 10, generator=torch.Generator().manual_seed(99))  # a stand-in for the LM's embeddings


def graph(n: int, e: int, seed: int) -> Data:
    g = torch.Generator().manual_seed(seed)
    words = torch.randint(0, VOCAB, (n, 3), generator=g)
    words[:, 2] = PAD_PIECE  # two word pieces per node
    return Data(x=torch.randn(n, D, generator=g), edge_index=torch.randint(0, n, (2, e), generator=g),
                edge_attr=torch.randn(e, D, generator=g), edge_fact=torch.randn(e, D, generator=g),
                node_word_ids=words, edge_unit=torch.randint(0, 4, (e,), generator=g))


def make_net(readout="mean", k=1, features="text", layers=2, seed=0):
    torch.manual_seed(seed)  # initial weights must not depend on which tests ran before
    net = GraphTokenNet(GraphTokenConfig(feature_dim=D, edge_dim=D, lm_hidden=10, features=features, readout=readout,
                                         num_graph_tokens=k,
                                         encoder=EncoderConfig(hidden=8, heads=2, layers=layers, dropout=0.0)))
    net.use_word_embedding(WORDS)
    return net


@pytest.mark.parametrize("layers,heads,hidden", [(1, 1, 8), (2, 4, 16), (3, 2, 12)])
def test_encoder_pools_one_vector_per_graph(layers, heads, hidden):
    enc = RelationalGraphEncoder(D, D, EncoderConfig(hidden=hidden, heads=heads, layers=layers, dropout=0.0)).eval()
    batch = Batch.from_data_list([graph(3, 4, 0), graph(1, 0, 1), graph(5, 7, 2)])
    out = enc(batch.x, batch.edge_index, batch.edge_attr, batch.batch, batch.num_graphs)
    assert out.shape == (3, hidden)
    assert len(enc.convs) == layers and enc.convs[0].heads == heads


@pytest.mark.parametrize("features", GRAPH_FEATURES)
@pytest.mark.parametrize("readout,k", READOUTS)
def test_batched_equals_one_at_a_time(readout, k, features):
    net = make_net(readout, k, features).eval()
    graphs = [graph(3, 4, 0), graph(1, 0, 1), graph(5, 7, 2)]
    together = net(Batch.from_data_list(graphs))
    alone = torch.cat([net(Batch.from_data_list([g])) for g in graphs])
    assert together.shape == (3, k, 10)
    torch.testing.assert_close(together, alone, atol=1e-5, rtol=1e-5)
    # a bare Data (no batch vector) is one graph
    torch.testing.assert_close(net(graphs[0]), alone[:1], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("readout,k", READOUTS)
def test_predicate_features_change_the_token(readout, k):
    """Relation-aware: same nodes and topology, different predicate embeddings → different token."""
    net = make_net(readout, k, layers=1).eval()
    g = graph(4, 5, 3)
    other = g.clone()
    other.edge_attr = torch.randn_like(g.edge_attr)
    assert not torch.allclose(net(g), net(other))
    no_edges = Data(x=g.x, edge_index=torch.zeros(2, 0, dtype=torch.long), edge_attr=None)
    assert net(no_edges).shape == (1, k, 10)


@pytest.mark.parametrize("features", GRAPH_FEATURES)
def test_fact_features_reach_the_token_only_when_chosen(features):
    """Same graph, other fact embeddings: the token changes exactly when the features read facts."""
    net = make_net(features=features, layers=1).eval()
    g = graph(4, 5, 3)
    other = g.clone()
    other.edge_fact = torch.randn_like(g.edge_fact)
    assert torch.allclose(net(g), net(other)) == (not needs_fact(features))


@pytest.mark.parametrize("features", GRAPH_FEATURES)
def test_word_features_reach_the_token_only_when_chosen(features):
    """Same graph, other node words: the token changes exactly with ``node_words``."""
    net = make_net(features=features, layers=1).eval()
    g = graph(4, 5, 3)
    other = g.clone()
    other.node_word_ids = (g.node_word_ids + 1).where(g.node_word_ids != PAD_PIECE, g.node_word_ids) % VOCAB
    assert torch.allclose(net(g), net(other)) == (features != "node_words")


def test_word_features_need_the_lm_embeddings_and_never_save_them():
    net = GraphTokenNet(GraphTokenConfig(feature_dim=D, edge_dim=D, lm_hidden=10, features="node_words",
                                         readout="mean", num_graph_tokens=1,
                                         encoder=EncoderConfig(hidden=8, heads=2, layers=1, dropout=0.0)))
    with pytest.raises(RuntimeError, match="use_word_embedding"):
        net(graph(3, 2, 0))
    assert net.encoder.input.in_features == D + 10  # [sentence embedding; word vector]
    embedding = torch.nn.Embedding(VOCAB, 10)
    net.use_word_embedding(embedding)
    assert net(graph(3, 2, 0)).shape == (1, 1, 10)
    assert not any(t.shape == embedding.weight.shape for t in net.state_dict().values())
    assert all(p is not embedding.weight for p in net.parameters())
    with pytest.raises(ValueError, match=r"\[vocab, 10\]"):
        net.use_word_embedding(torch.zeros(VOCAB, 7))
    # a node without word pieces (the zero node of an empty working memory) gets a zero word vector
    bare = graph(2, 1, 4)
    del bare.node_word_ids
    assert torch.isfinite(net(bare)).all()


@pytest.mark.parametrize("features", [f for f in GRAPH_FEATURES if needs_fact(f)])
def test_fact_features_without_edge_fact_are_refused(features):
    g = graph(4, 5, 3)
    del g.edge_fact
    with pytest.raises(ValueError, match="edge_fact"):
        make_net(features=features)(g)


@pytest.mark.parametrize("kind,k,match", [("mean", 2, "cannot give"), ("sum", 1, "readout must be"),
                                          ("queries", 0, "cannot give"), ("nodes", 0, "cannot give"),
                                          ("summary_nodes", 1, "cannot give"), ("summary_units", 1, "cannot give")])
def test_invalid_readout(kind, k, match):
    with pytest.raises(ValueError, match=match):
        GraphReadout(kind, 8, k)


def test_queries_readout_differs_per_query():
    """K learned queries give K different tokens for one graph (not one token repeated)."""
    out = make_net("queries", 3).eval()(graph(5, 7, 2))
    assert out.shape == (1, 3, 10)
    assert not torch.allclose(out[0, 0], out[0, 1]) and not torch.allclose(out[0, 1], out[0, 2])


def test_nodes_readout_keeps_the_first_k_nodes_in_order_and_fills_the_rest():
    readout = GraphReadout("nodes", 3, num_graph_tokens=4)
    with torch.no_grad():
        readout.fill.copy_(torch.tensor([7.0, 7.0, 7.0]))
    h = torch.arange(18, dtype=torch.float32).view(6, 3)  # graph 0: nodes 0-4 (cut to 4), graph 1: node 5
    out = readout(h, torch.tensor([0, 0, 0, 0, 0, 1]), 2)
    assert out.shape == (2, 4, 3)
    torch.testing.assert_close(out[0], h[:4])
    torch.testing.assert_close(out[1, 0], h[5])
    torch.testing.assert_close(out[1, 1:], torch.full((3, 3), 7.0))


def test_summary_nodes_readout_puts_the_mean_first():
    readout = GraphReadout("summary_nodes", 3, num_graph_tokens=3)
    h = torch.arange(15, dtype=torch.float32).view(5, 3)
    out = readout(h, torch.tensor([0, 0, 0, 1, 1]), 2)
    assert out.shape == (2, 3, 3)
    torch.testing.assert_close(out[0, 0], h[:3].mean(0))
    torch.testing.assert_close(out[0, 1:], h[:2])  # K - 1 = 2 node slots: the third node is cut
    torch.testing.assert_close(out[1], torch.stack([h[3:].mean(0), h[3], h[4]]))


def test_nodes_readout_token_follows_its_node():
    """Each node token depends on its own node's features first: changing node 0 moves token 0 most."""
    net = make_net("nodes", 4, layers=1).eval()
    g = Data(x=torch.randn(4, D), edge_index=torch.zeros(2, 0, dtype=torch.long), edge_attr=torch.zeros(0, D))
    other = g.clone()
    other.x[0] = torch.randn(D)
    moved = (net(g) - net(other)).abs().sum(-1)[0]
    assert moved[0] > 0 and torch.allclose(moved[1:], torch.zeros(3))


@pytest.mark.parametrize("features", GRAPH_FEATURES)
@pytest.mark.parametrize("readout,k", READOUTS)
def test_gradients_reach_every_parameter(readout, k, features):
    net = make_net(readout, k, features)
    net(Batch.from_data_list([graph(3, 4, 0), graph(2, 2, 1)])).pow(2).sum().backward()
    assert all(p.grad is not None for p in net.parameters())
    # a key bias adds the same score to every key of a query, which softmax cancels: its gradient is 0
    dead = [n for n, p in net.named_parameters() if not p.grad.abs().sum() > 0 and not n.endswith("lin_key.bias")]
    assert dead == []


@pytest.mark.parametrize("kwargs,match", [({"hidden": 10, "heads": 4}, "divisible"), ({"layers": 0}, "layers")])
def test_invalid_encoder_config(kwargs, match):
    with pytest.raises(ValueError, match=match):
        EncoderConfig(**kwargs)


@pytest.mark.parametrize("readout,k", READOUTS)
def test_config_round_trip(readout, k):
    cfg = GraphTokenConfig(D, D + 1, 12, EncoderConfig(hidden=8, heads=2, layers=3), projector_hidden=20,
                           features="edge_fact_concat", readout=readout, num_graph_tokens=k)
    again = GraphTokenConfig.from_dict(cfg.to_dict())
    assert again == cfg and isinstance(again.encoder, EncoderConfig) and again.num_graph_tokens == k


def test_config_without_readout_fields_is_the_paper_model():
    old = {"feature_dim": D, "edge_dim": D, "lm_hidden": 12, "encoder": {"hidden": 8, "heads": 2}}
    cfg = GraphTokenConfig.from_dict(old)
    assert (cfg.features, cfg.readout, cfg.num_graph_tokens) == ("text", "mean", 1)


@pytest.mark.parametrize("target", [0.05, 1.0])
def test_projector_match_scale(target):
    proj = GraphProjector(8, 16)
    sample = torch.randn(256, 8)
    proj.match_scale(target, sample)
    rms = proj(sample).pow(2).mean().sqrt().item()
    assert rms == pytest.approx(target, rel=1e-4)
