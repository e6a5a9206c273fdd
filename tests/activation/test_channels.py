from __future__ import annotations

import numpy as np
import pytest

from qgmem.activation.channels import AttributeChannel, LexicalChannel, SemanticChannel
from qgmem.activation.query import QueryConstraints


def test_lexical_ranks_matching_unit_first(small_store):
    channel = LexicalChannel.for_units(small_store.units)
    hits = channel.search("Which support group did she go to?", 5)
    assert hits[0][0] == 0  # u0: "LGBTQ support group"
    assert all(s > 0 for _, s in hits)
    assert [s for _, s in hits] == sorted((s for _, s in hits), reverse=True)


def test_lexical_stems_and_handles_unknown_or_empty(small_store):
    channel = LexicalChannel.for_units(small_store.units)
    assert channel.search("painting sunrises", 3)[0][0] == 1  # "painted a sunrise" after stemming
    assert channel.search("zzzz qqqq", 3) == []
    assert channel.search("the of and", 3) == []  # stop words only
    assert LexicalChannel([]).search("anything", 3) == []


@pytest.mark.parametrize("ann_min_units", [10_000, 1])  # exact flat index, then HNSW
def test_semantic_finds_nearest(small_store, ann_min_units):
    channel = SemanticChannel(small_store.embeddings, ann_min_units=ann_min_units)
    assert channel.approximate == (ann_min_units == 1)
    hits = channel.search(small_store.embeddings[4], 3)
    assert len(hits) == 3 and hits[0][0] == 4
    assert hits[0][1] == pytest.approx(1.0, abs=1e-5)
    assert len(channel.search(small_store.embeddings[4], 100)) == len(small_store)


def test_semantic_empty_store():
    assert SemanticChannel(np.zeros((0, 8), np.float32)).search(np.ones(8, np.float32), 5) == []


def test_attribute_entity_location_and_time(small_store, hash_encoder):
    channel = AttributeChannel(small_store.units, hash_encoder, threshold=0.6)
    by_entity = channel.search(QueryConstraints(entities=["Melanie"]), 10)
    assert {i for i, _ in by_entity} == {1, 3, 4, 6}
    both = channel.search(QueryConstraints(entities=["Caroline"], locations=["Boston"]), 10)
    assert both[0] == (5, pytest.approx(2.0, abs=1e-5))  # entity + location, each similarity 1
    timed = channel.search(QueryConstraints(time_start="2023-05-03", time_end="2023-05-09"), 10)
    assert {i for i, _ in timed} == {0, 5}  # u0 on 05-07, u5 over 05-01..05-07
    assert channel.search(QueryConstraints(time_start="2021-01-01", time_end="2021-12-31"), 10) == []
    assert channel.search(QueryConstraints(), 10) == []


def test_attribute_threshold_excludes_dissimilar(small_store, hash_encoder):
    strict = AttributeChannel(small_store.units, hash_encoder, threshold=0.99)
    assert strict.search(QueryConstraints(entities=["support group"]), 10) == []
    loose = AttributeChannel(small_store.units, hash_encoder, threshold=0.5)
    assert [i for i, _ in loose.search(QueryConstraints(entities=["support group"]), 10)] == [0]


@pytest.mark.parametrize("lazy", [False, True])
def test_attribute_embeds_each_distinct_name_once(small_store, hash_encoder, lazy):
    before = hash_encoder.calls
    channel = AttributeChannel(small_store.units, hash_encoder, lazy=lazy)
    # Caroline, LGBTQ support group, Melanie, adoption agencies, charity race, Sweden; Boston, beach, Sweden
    assert len(channel.entities.names) == 6 and len(channel.locations.names) == 3
    assert hash_encoder.calls - before == (0 if lazy else 9)
    channel.search(QueryConstraints(entities=["Melanie"], locations=["Sweden"]), 5)
    calls = hash_encoder.calls
    channel.search(QueryConstraints(entities=["Caroline"], locations=["Boston"]), 5)
    assert hash_encoder.calls == calls + 2  # only the query names; store names are never re-encoded

