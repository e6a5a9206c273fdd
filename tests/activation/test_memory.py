"""Memory: a store with its trace index and activator; build, append, activate -> graph."""

from __future__ import annotations

import numpy as np
import torch

from qgmem.activation.activator import Activator
from qgmem.activation.config import ActivationConfig
from qgmem.activation.graph import graph_to_data
from qgmem.activation.memory import Memory
from qgmem.memory.builder import MemoryBuilder
from qgmem.memory.config import ConstructionConfig
from qgmem.serving.history_file import sessions_to_dialogue

from .helpers import HashEncoder

SESSIONS = [[{"speaker": "User", "text": "I live in Lisbon with my two cats."},
             {"speaker": "Assistant", "text": "Lisbon is a lovely city to live in."}],
            [{"speaker": "User", "text": "I moved to Porto last month for a new job."},
             {"speaker": "User", "text": "I work at a bakery called Miga now."}],
            [{"speaker": "User", "text": "My sister Ana visited me in Porto and we ate pastries."}]]
QUESTIONS = ["Where do I live?", "Where do I work?", "Who visited me?"]
CONFIG = ConstructionConfig(extractor="heuristic", trace_threshold=0.3, min_fact_similarity=0.1)


def _builder() -> MemoryBuilder:
    return MemoryBuilder(CONFIG, HashEncoder())


def _facts(store) -> list[str]:
    return [u.fact for u in store.units]


def _ids(memory: Memory) -> list[list[str]]:
    return [[u.id for u in memory.activate(q).units] for q in QUESTIONS]


def _same_graph(a, b) -> None:
    for name in ("x", "edge_index", "edge_attr", "edge_unit"):
        assert torch.equal(getattr(a, name), getattr(b, name)), name
    assert a.node_text == b.node_text and a.edge_text == b.edge_text


def test_build_holds_the_builders_store_its_trace_index_and_the_seconds():
    dialogue = sessions_to_dialogue(SESSIONS, "history")
    memory = Memory.build(_builder(), dialogue, ActivationConfig(k=3))
    expected = _builder().build(dialogue)
    assert _facts(memory.store) == _facts(expected) and len(memory) == len(expected) == 5
    assert len(memory.trace_index) == len(memory) and memory.activation.k == 3
    assert set(memory.seconds) == {"construction"} and memory.seconds["construction"] > 0


def test_recall_is_activate_then_graph_to_data():
    encoder = HashEncoder()
    memory = Memory.build(MemoryBuilder(CONFIG, encoder), sessions_to_dialogue(SESSIONS, "history"))
    reference = Activator(memory.store, encoder, ActivationConfig())
    for question in QUESTIONS:
        working, graph, seconds = memory.recall(question, "2024-05-01")
        expected = reference.activate(question, "2024-05-01")
        assert [u.id for u in working.units] == [u.id for u in expected.units] and working.text == expected.text
        expected_graph = graph_to_data(expected.graph, encoder, facts=[u.fact for u in expected.units])
        _same_graph(graph, expected_graph)
        assert torch.equal(graph.edge_fact, expected_graph.edge_fact) and graph.edge_fact.shape[0] == graph.num_edges > 0
        assert set(seconds) == {"activation", "graph_features"}
    _, without_facts, _ = memory.recall(QUESTIONS[0], facts=False)
    assert getattr(without_facts, "edge_fact", None) is None


def test_an_empty_memory_recalls_the_empty_graph_without_an_activator():
    memory = Memory.build(_builder(), sessions_to_dialogue([], "history"))
    assert len(memory) == 0 and memory.activator is None
    working, graph, _ = memory.recall("Where do I live?")
    assert working.question == "Where do I live?" and working.units == [] and working.text == ""
    assert graph.num_nodes == 1 and graph.edge_index.shape == (2, 0) and not graph.x.any()
    assert graph.edge_fact.shape == (0, HashEncoder().dim)


def test_appending_sessions_gives_the_memory_of_building_them_at_once():
    builder = _builder()
    one = Memory.build(_builder(), sessions_to_dialogue(SESSIONS, "history"))
    grown = Memory.build(builder, sessions_to_dialogue(SESSIONS[:1], "history"))
    first = grown
    for session in SESSIONS[1:]:
        grown = grown.appended(builder, sessions_to_dialogue([session], "history").sessions)
    assert _facts(grown.store) == _facts(one.store) and len(grown.trace_index) == len(grown) == 5
    assert [t.unit_ids for t in grown.store.traces] == [t.unit_ids for t in one.store.traces]
    assert len(first) == 2 and _facts(first.store) == _facts(one.store)[:2]  # the memory appended to stays as it was
    assert _ids(grown) == _ids(one)
    assert set(grown.seconds) == {"construction"}


def test_the_first_question_after_an_append_extends_the_earlier_activator():
    """The grown memory takes over the activator of the memory it was grown from (the dense index gains
    the new rows in place); the earlier memory builds a fresh one if it is asked again, and both answer
    as fresh memories over their stores do."""
    builder = _builder()
    base = Memory.build(builder, sessions_to_dialogue(SESSIONS[:1], "history"))
    old_ids = _ids(base)
    activator = base.activator
    middle = base.appended(builder, sessions_to_dialogue(SESSIONS[1:2], "history").sessions)
    grown = middle.appended(builder, sessions_to_dialogue(SESSIONS[2:], "history").sessions)
    assert grown._grown_from is base  # a chain of appends keeps one earlier memory alive, not every store
    assert _ids(grown) == _ids(Memory(grown.store, builder.encoder))
    assert grown.activator.semantic is activator.semantic  # extended, not rebuilt
    assert base._activator is None and _ids(base) == old_ids and base.activator is not activator
    assert _ids(middle) == _ids(Memory(middle.store, builder.encoder))


def test_memories_share_a_given_reranker(small_store, hash_encoder):
    class ByOrder:
        def score(self, question, candidates, query_vec):
            return np.arange(len(candidates), 0, -1, dtype=np.float32)

    shared = ByOrder()
    a = Memory(small_store, hash_encoder, ActivationConfig(k=3), reranker=shared)
    b = Memory(small_store, hash_encoder, ActivationConfig(k=3), reranker=shared)
    assert a.activator.reranker is shared and b.activator.reranker is shared
    assert [u.id for u in a.activate("Caroline").units] == [u.id for u in b.activate("Caroline").units]
