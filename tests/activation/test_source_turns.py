"""The units' source turns at query time (a channel and a reranker term) and turn diversity."""

from __future__ import annotations

import numpy as np
import pytest

from qgmem.activation.activator import Activator, diversify_turns
from qgmem.memory.source_turns import source_turn_embeddings, source_turn_text
from qgmem.activation.config import ActivationConfig
from qgmem.activation.rerank import Candidate, EmbeddingReranker

from .helpers import make_unit, store_of

QUESTION = "puppy garden"


def _puppy_store(encoder):
    """The evidence's fact shares no word with the question; its source turn shares two. The distractor's
    fact shares one ("garden"), its source turn none."""
    units = [
        make_unit("evidence", "Biscuit stays at Grandma Rose's house", "Biscuit", "stays at", "Grandma Rose's house",
                  ["t1"], speaker="Caroline", source_text="The puppy plays in the garden all day"),
        make_unit("distractor", "Melanie planted tomatoes in her garden", "Melanie", "planted", "tomatoes",
                  ["t2"], speaker="Melanie", source_text="I planted tomatoes this spring"),
    ]
    return store_of(units, encoder)


def test_source_turn_embeddings_encode_each_distinct_turn_once(hash_encoder):
    units = [make_unit("a", "fact a", "a", "is", "x", ["t1"], speaker="Ann", source_text="We met at noon"),
             make_unit("b", "fact b", "b", "is", "y", ["t1"], speaker="Ann", source_text="We met at noon"),
             make_unit("c", "fact c", "c", "is", "z", ["t2"], source_text="Rain all day")]
    vectors = source_turn_embeddings(units, hash_encoder)
    assert vectors.shape == (3, hash_encoder.dim) and vectors.dtype == np.float32
    assert hash_encoder.calls == 2  # the shared turn once
    assert np.array_equal(vectors[0], vectors[1]) and not np.array_equal(vectors[0], vectors[2])
    assert np.allclose(vectors[2], hash_encoder.encode(["Rain all day"])[0])  # no speaker: the text alone
    assert source_turn_text(units[0]) == "Ann: We met at noon"
    assert source_turn_embeddings([], hash_encoder).shape == (0, hash_encoder.dim)


def test_source_turn_vectors_are_built_only_when_used(hash_encoder):
    store = _puppy_store(hash_encoder)
    off = ActivationConfig(channels=("lexical", "semantic", "attribute"), source_weight=0.0)
    assert Activator(store, hash_encoder, off).source_embeddings is None
    assert Activator(store, hash_encoder, ActivationConfig()).source_embeddings.shape == (2, 64)


@pytest.mark.parametrize("channel,first", [("semantic", "distractor"), ("source", "evidence")])
def test_source_channel_reaches_evidence_the_fact_lost(hash_encoder, channel, first):
    """Negative control: the fact channel alone ranks the distractor first; the source channel, the evidence."""
    config = ActivationConfig(k=1, pool_size=1, channel_depth=1, channels=(channel,))
    act = Activator(_puppy_store(hash_encoder), hash_encoder, config)
    wm = act.activate(QUESTION)
    assert [u.id for u in wm.units] == [first]
    assert list(act.last_hits) == [channel] and len(act.last_hits[channel]) == 1
    assert channel in act.last_timings


@pytest.mark.parametrize("weight,first", [(0.0, "distractor"), (1.0, "evidence")])
def test_source_weight_in_the_embedding_reranker(hash_encoder, weight, first):
    """Both units are pooled; only the source-turn term moves the evidence above the distractor."""
    config = ActivationConfig(k=1, channels=("semantic",), embedding_weight=1.0, lexical_weight=0.0,
                              source_weight=weight)
    act = Activator(_puppy_store(hash_encoder), hash_encoder, config)
    wm = act.activate(QUESTION)
    assert len(act.last_pool) == 2
    assert [u.id for u in wm.units] == [first]


def test_source_weight_scores_exactly(hash_encoder):
    store = _puppy_store(hash_encoder)
    source = source_turn_embeddings(store.units, hash_encoder)
    q = hash_encoder.encode([QUESTION])[0]
    pool = [Candidate(index=i, unit=u, fused=1.0) for i, u in enumerate(store.units)]
    plain = EmbeddingReranker(store.embeddings, weight=1.0).score(QUESTION, pool, q)
    with_source = EmbeddingReranker(store.embeddings, weight=1.0, source_embeddings=source,
                                    source_weight=0.5).score(QUESTION, pool, q)
    np.testing.assert_allclose(with_source - plain, 0.5 * (source @ q), rtol=1e-6, atol=1e-6)
    with pytest.raises(ValueError, match="source-turn embeddings"):
        EmbeddingReranker(store.embeddings, source_weight=0.5)


def _ranked(turns: list[list[str]]) -> list[tuple[Candidate, float]]:
    units = [make_unit(f"u{i}", f"fact {i}", "s", "p", "o", t) for i, t in enumerate(turns)]
    return [(Candidate(index=i, unit=u, fused=0.0), 1.0 - 0.1 * i) for i, u in enumerate(units)]


def test_diversify_turns_moves_repeats_below_the_rest():
    ranked = _ranked([["t1"], ["t1"], ["t2"], ["t1", "t2"], ["t3"], [], ["t1"]])
    one = diversify_turns(ranked, 1)
    assert [c.unit.id for c, _ in one] == ["u0", "u2", "u4", "u5", "u1", "u3", "u6"]
    scores = [s for _, s in one]
    assert scores == sorted(scores, reverse=True) and scores[:4] == [1.0, 0.8, 0.6, 0.5]
    # at 2 per turn u3 stays (t2 has one unit above it) and only u6, t1's third unit, moves
    two = diversify_turns(ranked, 2)
    assert [c.unit.id for c, _ in two] == ["u0", "u1", "u2", "u3", "u4", "u5", "u6"]
    assert two[-1][1] < two[-2][1] == 0.5


def test_diversify_turns_is_a_noop_without_repeats():
    ranked = _ranked([["t1"], ["t2"], ["t3"]])
    assert [(c.unit.id, s) for c, s in diversify_turns(ranked, 1)] == [(c.unit.id, s) for c, s in ranked]


def test_max_units_per_turn_in_activation(hash_encoder):
    units = [make_unit(f"u{i}", f"garden fact number {i}", "s", "p", "o", ["t1" if i < 3 else f"t{i}"])
             for i in range(5)]
    store = store_of(units, hash_encoder)
    base = dict(k=3, channels=("lexical", "semantic"), source_weight=0.0)
    question = "garden fact number 0 1 2"
    plain = Activator(store, hash_encoder, ActivationConfig(**base, max_units_per_turn=0)).activate(question)
    diverse = Activator(store, hash_encoder, ActivationConfig(**base, max_units_per_turn=1)).activate(question)
    assert [u.source_turn_ids[0] for u in plain.units] == ["t1", "t1", "t1"]  # control: all from one turn
    assert [u.source_turn_ids[0] for u in diverse.units][0] == "t1"
    assert len({u.source_turn_ids[0] for u in diverse.units}) == 3


def test_settings_validate_and_key():
    assert ActivationConfig().uses_source_turns  # the default since round 5
    assert ActivationConfig(channels=("lexical", "source"), source_weight=0.0).uses_source_turns
    assert not ActivationConfig(channels=("lexical", "semantic"), source_weight=0.0).uses_source_turns
    with pytest.raises(ValueError, match="channels"):
        ActivationConfig(channels=("lexical", "turns"))
    for bad in ({"source_weight": -0.1}, {"max_units_per_turn": -1}):
        with pytest.raises(ValueError, match=next(iter(bad))):
            ActivationConfig(**bad)
    base = ActivationConfig().key_dict()
    assert base["source_weight"] == 1.0 and base["max_units_per_turn"] == 1
    off = ActivationConfig(source_weight=0.0, max_units_per_turn=0).key_dict()
    assert "source_weight" not in off and "max_units_per_turn" not in off  # the earlier behaviour, the earlier key
    assert ActivationConfig(source_weight=0.3).key_dict() != base


def test_settings_recorded_before_round5_keep_their_activation():
    """An export written before the source settings existed loads with them off, not with today's defaults."""
    current = ActivationConfig(k=7)
    assert ActivationConfig.from_dict(current.to_dict()) == current  # a round trip keeps every field
    old = current.to_dict()
    for name in ("source_weight", "max_units_per_turn"):
        del old[name]
    old["channels"] = ["lexical", "semantic", "attribute"]
    loaded = ActivationConfig.from_dict(old)
    assert (loaded.source_weight, loaded.max_units_per_turn, loaded.k) == (0.0, 0, 7)
    assert not loaded.uses_source_turns
    with pytest.raises(TypeError):
        ActivationConfig.from_dict({"no_such_setting": 1})


def test_activator_uses_the_stores_vectors_and_extends_them_in_place(hash_encoder):
    store = _puppy_store(hash_encoder)
    store.source_embeddings = source_turn_embeddings(store.units, hash_encoder)
    calls = hash_encoder.calls
    act = Activator(store, hash_encoder, ActivationConfig())
    assert hash_encoder.calls == calls  # the store's vectors, no turn embedded again
    assert act.source_embeddings is not None and np.array_equal(act.source_embeddings, store.source_embeddings)
    more = store_of([*store.units, make_unit("late", "Biscuit chewed a shoe", "Biscuit", "chewed", "shoe", ["t3"],
                                             source_text="the puppy chewed my garden shoe")], hash_encoder)
    more.source_embeddings = source_turn_embeddings(more.units, hash_encoder)
    source_index = act.source
    grown = act.extended(more)
    assert grown.source is source_index and grown.source.size == 3  # the same index, the new row added
    assert [u.id for u in grown.activate("puppy garden shoe").units][0] == "late"


def test_a_large_store_without_source_vectors_is_warned_about(hash_encoder, caplog, monkeypatch):
    import qgmem.activation.activator as activator_module

    store = _puppy_store(hash_encoder)  # no source_embeddings: built before stores kept them
    monkeypatch.setattr(activator_module, "SOURCE_WARN_UNITS", 2)
    with caplog.at_level("WARNING", logger="qgmem.activation.activator"):
        act = Activator(store, hash_encoder, ActivationConfig())
    assert act.source_embeddings.shape == (2, hash_encoder.dim)
    assert "no source-turn vectors" in caplog.text and "2 units" in caplog.text
    caplog.clear()
    store.source_embeddings = act.source_embeddings  # with them: no warning
    with caplog.at_level("WARNING", logger="qgmem.activation.activator"):
        Activator(store, hash_encoder, ActivationConfig())
    assert "no source-turn vectors" not in caplog.text


def test_text_alone_for_a_store_built_without_the_label(hash_encoder):
    unit = make_unit("a", "fact a", "a", "is", "x", ["t1"], speaker="Ann", source_text="We met at noon")
    assert source_turn_text(unit, label=False) == "We met at noon"
    bare = source_turn_embeddings([unit], hash_encoder, label=False)
    np.testing.assert_allclose(bare[0], hash_encoder.encode(["We met at noon"])[0], rtol=1e-6)
    # negative control: the labelled vector is another one
    assert not np.allclose(bare[0], source_turn_embeddings([unit], hash_encoder)[0])


def test_builder_and_append_embed_labelled_turns_and_old_stores_read_as_built(hash_encoder):
    """Build and append embed ``speaker: text``; an activator over a store without source vectors embeds
    them as the store's recorded construction did (a store built with the retired label off: text alone)."""
    from qgmem.memory.builder import MemoryBuilder
    from qgmem.memory.config import ConstructionConfig
    from qgmem.serving.history_file import sessions_to_dialogue

    sessions = [[{"speaker": "User", "text": "I adopted a puppy named Biscuit last week."},
                 {"speaker": "Assistant", "text": "Biscuit is a lovely name for a puppy."}]]
    more = sessions_to_dialogue([[{"speaker": "User", "text": "Biscuit now sleeps in the garden shed."}]], "more")
    builder = MemoryBuilder(ConstructionConfig(extractor="heuristic"), hash_encoder)
    store = builder.build(sessions_to_dialogue(sessions, "history"))
    store, _ = builder.append(store, more.sessions)
    assert len(store) >= 2 and {u.session_id for u in store.units} == {"s0", "s1"}
    labelled = source_turn_embeddings(store.units, hash_encoder)
    np.testing.assert_allclose(store.source_embeddings, labelled, rtol=1e-6)
    assert "source_turn_label" not in store.meta["params"]  # the key of the stores built before it was retired

    store.source_embeddings = None  # as a store saved before stores kept the vectors
    np.testing.assert_allclose(Activator(store, hash_encoder, ActivationConfig()).source_embeddings, labelled,
                               rtol=1e-6)
    store.meta["params"]["source_turn_label"] = False  # built with the retired label off
    np.testing.assert_allclose(Activator(store, hash_encoder, ActivationConfig()).source_embeddings,
                               source_turn_embeddings(store.units, hash_encoder, label=False), rtol=1e-6)
