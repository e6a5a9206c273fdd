from __future__ import annotations

import numpy as np
import pytest

from qgmem.activation.activator import Activator, superseded_map
from qgmem.activation.config import ActivationConfig
from qgmem.activation.graph import graph_to_data
from qgmem.memory.store import MemoryStore


@pytest.mark.parametrize("k", [1, 3, 8])
def test_working_memory_shape_and_order(small_store, hash_encoder, k):
    act = Activator(small_store, hash_encoder, ActivationConfig(k=k, pool_size=max(k, 10)))
    wm = act.activate("Where did Caroline run a charity race?", None)
    assert len(wm.units) == min(k, 8)
    assert wm.scores == sorted(wm.scores, reverse=True)
    assert wm.units[0].id == "u5"
    lines = wm.text.splitlines()
    assert len(lines) == len(wm.units) and lines[0].startswith("[M1] Caroline ran a charity race")
    assert wm.graph.num_edges <= k and wm.graph.num_nodes <= 2 * k
    for position, (head, _) in zip(wm.graph.edge_unit, wm.graph.edge_index):
        assert wm.graph.node_text[head] == wm.units[position].subject
    assert wm.constraints.entities == ["Caroline"]
    assert set(act.last_timings) >= {"parse_encode", "lexical", "semantic", "attribute", "total"}


def test_superseded_member_brings_its_latest_state(small_store, hash_encoder):
    assert superseded_map(small_store) == {"u3": "u4"}
    act = Activator(small_store, hash_encoder, ActivationConfig(k=3, channels=("lexical",)))
    question = "Is she still a nurse at the city hospital?"  # only u3 matches lexically
    constraints = act.parse(question)
    qvec, _, _ = act.encode_query(question, constraints)
    pool = act.pool(act.channel_hits(question, constraints, qvec))
    assert [c.unit.id for c in pool] == ["u3", "u4"]  # the current state right after the old one
    assert pool[-1].via == [small_store.index_of("u3")]
    wm = act.activate(question)
    assert wm.units[0].id == "u3" and "-> update, current:" in wm.text.splitlines()[0]


@pytest.mark.parametrize("channels", [("lexical",), ("semantic",), ("attribute",), ("lexical", "semantic")])
def test_channel_subsets(small_store, hash_encoder, channels):
    act = Activator(small_store, hash_encoder, ActivationConfig(k=2, channels=channels))
    question, qtime = "Did Caroline go to a support group last week?", "2023-05-08"
    wm = act.activate(question, qtime)
    assert len(wm.units) == 2
    assert set(channels) <= set(act.last_timings)
    if channels == ("attribute",):  # in the pool, entity + time matches come before entity-only ones
        constraints = act.parse(question, qtime)
        qvec, evecs, lvecs = act.encode_query(question, constraints)
        pool = act.pool(act.channel_hits(question, constraints, qvec, evecs, lvecs))
        assert {c.unit.id for c in pool[:2]} == {"u0", "u5"} and len(pool) == 4


def test_custom_reranker_decides_order(small_store, hash_encoder):
    class ByOrder:
        def score(self, question, candidates, query_vec=None):
            return np.asarray([-c.unit.order for c in candidates], dtype=np.float32)

    wm = Activator(small_store, hash_encoder, ActivationConfig(k=3), reranker=ByOrder()).activate("Caroline")
    assert [u.order for u in wm.units] == sorted(u.order for u in wm.units)


def test_llm_parser_through_activator(small_store, hash_encoder):
    reply = '{"entities": ["Melanie"], "locations": ["beach"], "time": null}'
    act = Activator(small_store, hash_encoder, ActivationConfig(k=2, parser="llm"), llm=lambda prompt: reply)
    wm = act.activate("Where do the kids like to go camping?")
    assert wm.constraints.locations == ["beach"] and wm.units[0].id == "u6"


def test_empty_store_gives_valid_empty_memory(hash_encoder):
    store = MemoryStore(dialogue_id="empty", embeddings=np.zeros((0, hash_encoder.dim), np.float32))
    wm = Activator(store, hash_encoder).activate("What did I say?")
    assert wm.units == [] and wm.text == "" and wm.graph.num_nodes == 0
    data = graph_to_data(wm.graph, hash_encoder)
    assert data.x.shape == (1, hash_encoder.dim) and data.edge_index.shape == (2, 0)


def test_bad_store_and_config_errors(small_store, hash_encoder):
    bad = MemoryStore(dialogue_id="d9", units=small_store.units, embeddings=small_store.embeddings[:3])
    with pytest.raises(ValueError, match="store 'd9': field 'embeddings'"):
        Activator(bad, hash_encoder)
    with pytest.raises(ValueError, match="pool_size"):
        ActivationConfig(k=20, pool_size=10)
    with pytest.raises(ValueError, match="channels"):
        ActivationConfig(channels=("graph",))
    with pytest.raises(ValueError, match="needs reranker_path"):
        Activator(small_store, hash_encoder, ActivationConfig(reranker="cross-encoder"))


def test_pool_carries_normalized_bm25_evidence(small_store, hash_encoder):
    act = Activator(small_store, hash_encoder, ActivationConfig(k=3))
    question = "Where did Caroline run a charity race?"
    constraints = act.parse(question)
    qvec, ents, locs = act.encode_query(question, constraints)
    hits = act.channel_hits(question, constraints, qvec, ents, locs)
    pool = act.pool(hits)
    lexical = dict(hits["lexical"])
    best = max(lexical.values())
    for c in pool:
        assert c.lexical == pytest.approx(lexical.get(c.index, 0.0) / best)
    assert max(c.lexical for c in pool) == pytest.approx(1.0)
    assert any(c.lexical == 0.0 for c in pool)  # candidates only the other channels found


def test_rerank_depth_scores_only_the_embedding_top(small_store, hash_encoder):
    class ByOrder:
        seen: list[int] = []

        def score(self, question, candidates, query_vec=None):
            ByOrder.seen.append(len(candidates))
            return np.asarray([-c.unit.order for c in candidates], dtype=np.float32)

    question = "Where did Caroline run a charity race?"
    base = Activator(small_store, hash_encoder, ActivationConfig(k=8, pool_size=8))
    base.activate(question)
    embedding_top3 = [c.unit.id for c, _ in base.last_ranking[:3]]
    act = Activator(small_store, hash_encoder, ActivationConfig(k=8, pool_size=8, reranker="llm", rerank_depth=3),
                    reranker=ByOrder())
    wm = act.activate(question)
    assert ByOrder.seen == [3]  # the model saw only the embedding reranker's top 3
    by_order = sorted(embedding_top3, key=lambda uid: small_store.unit(uid).order)
    assert [u.id for u in wm.units[:3]] == by_order
    assert [u.id for u in wm.units[3:]] == [c.unit.id for c, _ in base.last_ranking[3:]]
    assert wm.scores == sorted(wm.scores, reverse=True)


@pytest.mark.parametrize("depth", [0, 3])
def test_model_weight_blends_the_first_stage_score(small_store, hash_encoder, depth):
    """At α < 1 a scored unit's score is (1 − α) · embedding + α · model; α 1 is the model alone."""

    question = "Where did Caroline run a charity race?"
    base = Activator(small_store, hash_encoder, ActivationConfig(k=8, pool_size=8))
    base.activate(question)
    embedding = {c.unit.id: s for c, s in base.last_ranking}
    scored = [c.unit.id for c, _ in base.last_ranking[: depth or len(base.last_ranking)]]
    favourite = scored[1]  # the model's favourite is not the embedding's first

    class Constant:
        def score(self, question, candidates, query_vec=None):
            return np.asarray([0.5 if c.unit.id == favourite else 0.0 for c in candidates], dtype=np.float32)
    for alpha in (0.5, 0.1):
        act = Activator(small_store, hash_encoder, ActivationConfig(k=8, pool_size=8, reranker="llm",
                                                                    rerank_depth=depth, model_weight=alpha),
                        reranker=Constant())
        act.activate(question)
        got = {c.unit.id: s for c, s in act.last_ranking if c.unit.id in scored}
        want = {uid: (1 - alpha) * embedding[uid] + alpha * (0.5 if uid == favourite else 0.0) for uid in scored}
        assert got == pytest.approx(want, abs=1e-5)
    # control: the model alone puts its favourite first, whatever the embedding order
    alone = Activator(small_store, hash_encoder, ActivationConfig(k=8, pool_size=8, reranker="llm",
                                                                  rerank_depth=depth), reranker=Constant())
    alone.activate(question)
    assert alone.last_ranking[0][0].unit.id == favourite
    assert "model_weight" not in ActivationConfig().key_dict()  # at 1.0: the key of before
    assert ActivationConfig(model_weight=0.5).key_dict()["model_weight"] == 0.5
    with pytest.raises(ValueError, match="model_weight"):
        ActivationConfig(model_weight=1.5)


