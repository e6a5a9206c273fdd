"""Appending sessions to a store gives the store of a one-pass build (units, traces, retrieval)."""

from __future__ import annotations

import numpy as np

from qgmem.data.loaders import load_cases
from qgmem.data.records import Session, Turn
from qgmem.memory.builder import MemoryBuilder
from qgmem.memory.config import ConstructionConfig
from qgmem.memory.traces import TraceIndex
from qgmem.serving.history_file import sessions_to_dialogue

from activation.helpers import HashEncoder, make_unit


def _plain(dialogue) -> list[list[dict]]:
    return [[{"speaker": t.speaker, "text": t.text} for t in s.turns] for s in dialogue.sessions]


def _session(turns: list[dict]) -> Session:
    return Session(id="new", turns=[Turn(id=str(i), session_id="new", speaker=t["speaker"],
                                         role="assistant" if t["speaker"] == "Assistant" else "user", text=t["text"])
                                    for i, t in enumerate(turns)])


def _appended(builder: MemoryBuilder, sessions: list[list[dict]]):
    store = builder.build(sessions_to_dialogue([], "history"))
    index = None
    for session in sessions:
        store, index = builder.append(store, [_session(session)], index)
    return store, index


def _assert_same(one, inc) -> None:
    assert [u.to_dict() for u in inc.units] == [u.to_dict() for u in one.units]
    assert [t.to_dict() for t in inc.traces] == [t.to_dict() for t in one.traces]
    np.testing.assert_allclose(inc.embeddings, one.embeddings, atol=1e-5)
    assert inc.source_embeddings.shape == inc.embeddings.shape  # the source-turn vectors grow with the store
    np.testing.assert_allclose(inc.source_embeddings, one.source_embeddings, atol=1e-5)
    assert inc.meta["extent"] == one.meta["extent"]
    assert inc.meta["counts"]["units"] == one.meta["counts"]["units"]
    assert inc.meta["counts"]["traces"] == one.meta["counts"]["traces"]


def test_append_continues_ids_windows_and_traces():
    """Hand-made sessions with a trace that spans two sessions (an update of where the user lives)."""
    sessions = [[{"speaker": "User", "text": "I live in Lisbon with my two cats."},
                 {"speaker": "Assistant", "text": "Lisbon is a lovely city to live in."}],
                [{"speaker": "User", "text": "I moved to Porto last month for a new job."},
                 {"speaker": "User", "text": "I work at a bakery called Miga now."}]]
    config = ConstructionConfig(extractor="heuristic", trace_threshold=0.3, min_fact_similarity=0.1)
    one = MemoryBuilder(config, HashEncoder()).build(sessions_to_dialogue(sessions, "history"))
    inc, index = _appended(MemoryBuilder(config, HashEncoder()), sessions)
    _assert_same(one, inc)
    assert {u.session_id for u in inc.units} == {"s0", "s1"}
    assert len(index) == len(inc) and index.neighbour_ids.shape == (len(inc), config.neighbours + 1)
    assert any(len({inc.unit(uid).session_id for uid in t.unit_ids}) == 2 for t in inc.traces), \
        "the control needs a trace across the two sessions"


def test_trace_index_extend_equals_build():
    """Row by row, the extended neighbour lists are those of one search over all units."""
    rng = np.random.default_rng(0)
    emb = rng.standard_normal((60, 16)).astype(np.float32)
    emb /= np.linalg.norm(emb, axis=1, keepdims=True)
    config = ConstructionConfig(neighbours=5)
    made = [make_unit(f"u{i}", f"fact {i}", "User", "likes", f"thing {i}", ["t"]) for i in range(60)]
    enc = HashEncoder(16)
    whole = TraceIndex.build(made, emb, enc.encode, config)
    part = TraceIndex.build(made[:25], emb[:25], enc.encode, config)
    part = part.extend(made[25:40], emb[:40], enc.encode, config).extend(made[40:], emb, enc.encode, config)
    assert np.array_equal(np.sort(part.neighbour_ids, axis=1), np.sort(whole.neighbour_ids, axis=1))
    np.testing.assert_allclose(part.neighbour_sims, whole.neighbour_sims, atol=1e-5)
    np.testing.assert_allclose(part.keys, whole.keys)


def test_append_equals_one_pass_on_a_real_convomem_case():
    """A real ConvoMem case (7 sessions, 242 turns), the embedded parser extractor and MiniLM: appending
    its sessions one at a time equals the one-pass build in units, traces and retrieval results."""
    from qgmem.activation.activator import Activator
    from qgmem.embed import SentenceEncoder

    case = load_cases("convomem", "data/convomem").cases[0]
    sessions = _plain(case.dialogue)
    assert len(sessions) == 7
    config = ConstructionConfig()
    one = MemoryBuilder(config, SentenceEncoder()).build(sessions_to_dialogue(sessions, "history"))
    inc, _ = _appended(MemoryBuilder(config, SentenceEncoder()), sessions)  # its own encoder: no shared memo
    assert len(one) > 100 and len(one.traces) > 0
    _assert_same(one, inc)
    questions = [qa.question for qa in case.qas] + [
        "What color do I use for hot leads?", "Where do I work?", "What did I say about my manager?",
        "Which tools do I use for follow-ups?", "What time do I block out for calls?"]
    encoder = SentenceEncoder()
    a, b = Activator(one, encoder), Activator(inc, encoder)
    for q in questions:
        assert [u.id for u in a.activate(q).units] == [u.id for u in b.activate(q).units], q


def test_extended_activator_answers_as_a_fresh_one():
    """After an append the dense index gets the new rows in place; activation equals a rebuilt activator's."""
    from qgmem.activation.activator import Activator

    sessions = [[{"speaker": "User", "text": f"I planted {n} tulips near the {w} shed on day {n}."}
                 for n, w in enumerate(["red", "blue", "old", "new", "green"])],
                [{"speaker": "User", "text": "My neighbour Omar fixed the blue shed roof."},
                 {"speaker": "User", "text": "I moved the tulips to the garden in Porto."}]]
    encoder = HashEncoder()
    builder = MemoryBuilder(ConstructionConfig(extractor="heuristic"), encoder)
    store, index = _appended(builder, sessions[:1])
    old = Activator(store, encoder)
    grown, _ = builder.append(store, [_session(sessions[1])], index)
    extended, fresh = old.extended(grown), Activator(grown, encoder)
    assert extended.semantic is old.semantic and extended.semantic.size == len(grown) > len(store)
    for q in ["Who fixed the shed roof?", "Where are the tulips now?", "How many tulips on day 3?"]:
        assert [u.id for u in extended.activate(q).units] == [u.id for u in fresh.activate(q).units], q
