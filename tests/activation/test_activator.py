from __future__ import annotations

import numpy as np
import pytest

from qgmem.activation.activator import Activator, superseded_map
from qgmem.activation.config import ActivationConfig
from qgmem.activation.graph import graph_to_data
from qgmem.memory.records import MemoryTrace
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


QUESTION_ON_OLD_STATE = "Does Melanie work as a nurse at the city hospital?"


def test_superseded_member_folded_into_latest(small_store, hash_encoder):
    assert superseded_map(small_store) == {"u3": "u4"}
    folded = Activator(small_store, hash_encoder, ActivationConfig(k=3, superseded="fold")).activate(QUESTION_ON_OLD_STATE)
    ids = [u.id for u in folded.units]
    assert "u3" not in ids and ids[0] == "u4"  # the latest state represents the trace
    assert list(folded.traces) == ["tr0"] and "Trajectory: origin: Melanie works as a nurse" in folded.text


@pytest.mark.parametrize(("mode", "expected_pool"), [("attach", ["u3", "u4"]), ("keep", ["u3"])])
def test_superseded_member_attach_or_keep(small_store, hash_encoder, mode, expected_pool):
    act = Activator(small_store, hash_encoder, ActivationConfig(k=3, superseded=mode, channels=("lexical",)))
    question = "Is she still a nurse at the city hospital?"  # only u3 matches lexically
    constraints = act.parse(question)
    qvec, _, _ = act.encode_query(question, constraints)
    pool = act.pool(act.channel_hits(question, constraints, qvec))
    assert [c.unit.id for c in pool] == expected_pool  # attach: the current state right after the old one
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


# -- multi-hop mechanisms ------------------------------------------------------------------------------
MULTI_HOP_QUESTION = "Where does the puppy Caroline adopted live now?"


def _multi_hop_store(encoder) -> MemoryStore:
    """The first hop names the puppy; the second hop (where Biscuit stays) shares no word with the question.

    Four distractors share only "Caroline" with the question, so "Caroline" is too common to link
    through (above ``expansion_max_entity_units`` = 3) while "Biscuit" (two units) is not; a third unit
    of the puppy's trace is reached through the trace alone.
    """
    from .helpers import make_unit, store_of

    units = [
        make_unit("hop1", "Caroline adopted a puppy named Biscuit", "Caroline", "adopted", "Biscuit", ["t1"],
                  entities=["Caroline", "Biscuit"], speaker="Caroline", order=1),
        make_unit("hop2", "Biscuit stays with Grandma Rose in Denver", "Biscuit", "stays with", "Grandma Rose",
                  ["t2"], entities=["Biscuit", "Grandma Rose"], location="Denver", speaker="Caroline", order=2),
        *[make_unit(f"d{i}", f"Caroline {text}", "Caroline", "did", text, [f"t{10 + i}"], entities=["Caroline"],
                    speaker="Caroline", order=10 + i)
          for i, text in enumerate(["bought running shoes", "likes jazz music", "visited Paris", "painted a fence"])],
        make_unit("tr_a", "Biscuit learned to sit", "Biscuit", "learned", "sit", ["t30"], speaker="Caroline", order=30),
    ]
    trace = MemoryTrace(id="trB", dialogue_id="d1", subject="Biscuit", relation="learned",
                        unit_ids=["hop1", "tr_a"], transitions=["origin", "supplement"], latest_unit_id="tr_a")
    return store_of(units, encoder, [trace])


def _multi_hop_ids(encoder, **mechanism) -> list[str]:
    # lexical channel only and a fused-order reranker, so which units reach the pool decides the outcome
    config = ActivationConfig(k=4, pool_size=10, channels=("lexical",), embedding_weight=0.0, lexical_weight=0.0,
                              source_weight=0.0, max_units_per_turn=0, expansion_max_entity_units=3, **mechanism)
    return [u.id for u in Activator(_multi_hop_store(encoder), encoder, config).activate(MULTI_HOP_QUESTION).units]


def test_multi_hop_needs_a_mechanism(hash_encoder):
    ids = _multi_hop_ids(hash_encoder)  # negative control: the question alone never reaches the second hop
    assert ids[0] == "hop1" and "hop2" not in ids and "tr_a" not in ids


def test_expansion_reaches_second_hop_through_entity_and_trace(hash_encoder):
    ids = _multi_hop_ids(hash_encoder, expansion_seeds=1)
    # the trace member first, then the unit sharing the rare entity (tied with the distractors' fused score)
    assert ids[:2] == ["hop1", "tr_a"] and "hop2" in ids


def test_expansion_does_not_link_through_common_entities(hash_encoder):
    act = Activator(_multi_hop_store(hash_encoder), hash_encoder,
                    ActivationConfig(k=3, pool_size=10, channels=("lexical",), expansion_max_entity_units=3))
    d0 = act.store.index_of("d0")
    assert act.expansion_hits([d0]) == []  # "Caroline" is held by 5 units > 3: no link
    act.config.expansion_max_entity_units = 5
    assert {act.store.units[i].id for i, _ in act.expansion_hits([d0])} == {"hop1", "d1", "d2", "d3"}


def test_feedback_round_reaches_second_hop(hash_encoder):
    ids = _multi_hop_ids(hash_encoder, feedback_seeds=1)
    # "Biscuit" from the first round's top fact finds both units that name it, as a fresh fused list
    assert ids[:2] == ["hop1", "tr_a"] and "hop2" in ids


def _pools(encoder, **mechanism) -> tuple[set[str], set[str]]:
    """Unit ids of the first round's pool (no mechanism) and of the pool after the multi-hop round."""
    store = _multi_hop_store(encoder)

    def pool_ids(**settings) -> set[str]:
        config = ActivationConfig(k=4, pool_size=5, channels=("lexical",), source_weight=0.0, max_units_per_turn=0,
                                  expansion_max_entity_units=3, **settings)
        act = Activator(store, encoder, config)
        act.activate(MULTI_HOP_QUESTION)
        return {c.unit.id for c in act.last_pool}

    return pool_ids(), pool_ids(**mechanism)


def test_hop_round_competes_for_the_pool_without_extra_units(hash_encoder):
    # negative control: the feedback list's two new units (ranks 1 and 2 of their list) take two of the
    # five slots, so two first-round units drop out of the pool the reranker sees
    first, after = _pools(hash_encoder, feedback_seeds=1)
    assert first == {"hop1", "d0", "d1", "d2", "d3"}
    assert len(after) == 5 and {"hop2", "tr_a"} <= after and len(first - after) == 2


@pytest.mark.parametrize("extra", [1, 2, 5])
def test_hop_extra_units_keep_the_first_pool_and_add_at_most_n(hash_encoder, extra):
    first, after = _pools(hash_encoder, feedback_seeds=1, hop_extra_units=extra)
    added = after - first
    assert first <= after  # nothing of the first round is lost
    assert len(added) == min(extra, 2) and added <= {"hop2", "tr_a"}  # the feedback list brings only these two


def test_hop_extra_units_apply_to_expansion(hash_encoder):
    first, after = _pools(hash_encoder, expansion_seeds=1, hop_extra_units=1)
    assert first <= after and len(after - first) == 1


def test_mechanism_settings_are_validated():
    with pytest.raises(ValueError, match="expansion_seeds"):
        ActivationConfig(expansion_seeds=-1)
    with pytest.raises(ValueError, match="expansion_max_entity_units"):
        ActivationConfig(expansion_max_entity_units=0)
    with pytest.raises(ValueError, match="hop_extra_units"):
        ActivationConfig(hop_extra_units=-1)


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


def test_fusion_weights_reach_the_pool_and_the_key(small_store, hash_encoder):
    question = "Did Caroline go to a support group last week?"
    pools = {}
    for name, weights in (("plain", {}), ("semantic x100", {"semantic": 100.0})):
        act = Activator(small_store, hash_encoder, ActivationConfig(k=2, channels=("lexical", "semantic"),
                                                                    fusion_weights=weights))
        constraints = act.parse(question)
        qvec, _, _ = act.encode_query(question, constraints)
        hits = act.channel_hits(question, constraints, qvec)
        pools[name] = [c.index for c in act.pool(hits)]
        semantic_order = [i for i, _ in hits["semantic"]]
    assert pools["plain"] != semantic_order  # control: plain RRF is not the semantic list alone
    # a heavy semantic weight makes the fused order that channel's own order
    assert pools["semantic x100"][: len(semantic_order)] == semantic_order
    assert "fusion_weights" not in ActivationConfig().key_dict()  # unset: the key of before
    assert ActivationConfig(fusion_weights={"source": 2}).key_dict()["fusion_weights"] == {"source": 2.0}
    for bad in ({"turns": 1.0}, {"source": 0.0}):
        with pytest.raises(ValueError, match="fusion_weights"):
            ActivationConfig(fusion_weights=bad)
    recorded = ActivationConfig(fusion_weights={"source": 2.0}).to_dict()
    assert ActivationConfig.from_dict(recorded).fusion_weights == {"source": 2.0}
