"""``dense_speaker_names``: a question that names the wrong speaker (LoCoMo's adversarial form) must not
pull dense retrieval to that speaker's units when the setting says so."""

from __future__ import annotations

import numpy as np
import pytest

from qgmem.activation.activator import Activator, speaker_name_pattern, without_speaker_names
from qgmem.activation.config import ActivationConfig

from .helpers import make_unit, store_of

#: Priya asked about what Daniel said: the evidence is Daniel's unit
SWAPPED = "Where does Priya volunteer on weekends?"


def _store(encoder):
    units = [
        make_unit("gold", "Daniel volunteers on weekends at the shelter", "Daniel", "volunteers at", "shelter",
                  ["t1"], speaker="Daniel", order=1),
        # construction writes the speaker's name for every I and you, so her units repeat it
        make_unit("p1", "Priya said Priya's coach trains Priya", "Priya", "said", "coach", ["t2"],
                  speaker="Priya", order=2),
        make_unit("p2", "Priya thinks Priya should rest, Priya says", "Priya", "thinks", "rest", ["t3"],
                  speaker="Priya", order=3),
    ]
    return store_of(units, encoder)


def _top(encoder, mode: str) -> str:
    # the fact channel and a pure-cosine reranker: only the dense query decides the order
    config = ActivationConfig(k=3, pool_size=3, channels=("semantic",), embedding_weight=1.0, lexical_weight=0.0,
                              source_weight=0.0, max_units_per_turn=0, dense_speaker_names=mode)
    return Activator(_store(encoder), encoder, config).activate(SWAPPED).units[0].id


def test_keep_lets_the_wrong_name_win(hash_encoder):
    assert _top(hash_encoder, "keep") == "p1"  # negative control: the name outweighs the content words


def test_drop_puts_the_evidence_first(hash_encoder):
    assert _top(hash_encoder, "drop") == "gold"


def test_blend_is_retired():
    with pytest.raises(ValueError, match="dense_speaker_names"):
        ActivationConfig(dense_speaker_names="blend")


def test_names_are_removed_whole_words_with_possessives():
    pattern = speaker_name_pattern([make_unit("a", "x", "x", "p", "o", ["t"], speaker="Priya"),
                                    make_unit("b", "x", "x", "p", "o", ["t"], speaker="Daniel"),
                                    make_unit("c", "x", "x", "p", "o", ["t"], speaker="")])
    assert without_speaker_names("What did Priya's cat and Daniel eat?", pattern) == "What did cat and eat?"
    assert without_speaker_names("Who is Priyanka?", pattern) == "Who is Priyanka?"  # not a whole word
    assert without_speaker_names("Priya?", pattern) == "Priya?"  # nothing left: the question as it is
    assert without_speaker_names("Priya?", None) == "Priya?"


def test_query_vectors_per_mode(hash_encoder):
    store = _store(hash_encoder)
    neutral = "Where does volunteer on weekends?"
    vectors = {}
    for mode in ("keep", "drop"):
        act = Activator(store, hash_encoder, ActivationConfig(channels=("semantic",), source_weight=0.0,
                                                              dense_speaker_names=mode))
        vectors[mode] = act.encode_query(SWAPPED, act.parse(SWAPPED))[0]
    full, bare = hash_encoder.encode([SWAPPED, neutral])
    np.testing.assert_allclose(vectors["keep"], full, atol=1e-6)
    np.testing.assert_allclose(vectors["drop"], bare, atol=1e-6)
    # a question naming no speaker is encoded as it is in every mode
    act = Activator(store, hash_encoder, ActivationConfig(channels=("semantic",), source_weight=0.0,
                                                          dense_speaker_names="drop"))
    q = "Who volunteers on weekends?"
    np.testing.assert_allclose(act.encode_query(q, act.parse(q))[0], hash_encoder.encode([q])[0], atol=1e-6)


def test_mode_is_validated_and_keyed_only_when_changed():
    with pytest.raises(ValueError, match="dense_speaker_names"):
        ActivationConfig(dense_speaker_names="mask")
    assert ActivationConfig().dense_speaker_names == "drop"  # the default since round 10
    assert ActivationConfig().key_dict()["dense_speaker_names"] == "drop"
    # "keep", the behaviour before the field existed, gives back the key of before
    assert "dense_speaker_names" not in ActivationConfig(dense_speaker_names="keep").key_dict()


def test_a_record_written_before_the_field_keeps_the_names():
    recorded = ActivationConfig().to_dict()
    del recorded["dense_speaker_names"]
    assert ActivationConfig.from_dict(recorded).dense_speaker_names == "keep"
