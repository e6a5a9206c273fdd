"""The evidence-ablated store: units grounded in gold turns are gone, traces rebuilt, the store untouched."""

from __future__ import annotations

from qgmem.activation.records import LocalGraph
from qgmem.evaluation.ablate import evidence_only_nodes, evidence_unit_ids, sham_unit_ids, without_units
from qgmem.memory.config import ConstructionConfig

from activation.helpers import HashEncoder, build_small_store, make_unit  # tests/activation/helpers.py


def test_evidence_units_are_the_units_grounded_in_a_gold_turn():
    store = build_small_store(HashEncoder())
    assert evidence_unit_ids(store.units, ["t6"]) == {"u2"}  # a two-turn span counts by any of its turns
    assert evidence_unit_ids(store.units, ["t8", "t20", "t99"]) == {"u3", "u4"}
    assert evidence_unit_ids(store.units, []) == set()


def test_without_units_rebuilds_the_traces_over_what_is_left():
    encoder = HashEncoder()
    store = build_small_store(encoder)
    before = ([u.trace_id for u in store.units], [t.unit_ids for t in store.traces])
    assert any(set(t.unit_ids) == {"u3", "u4"} for t in store.traces)  # the changed job is a trace
    reduced = without_units(store, {"u4"}, encoder.encode, ConstructionConfig())
    assert [u.id for u in reduced.units] == ["u0", "u1", "u2", "u3", "u5", "u6", "u7"]
    assert reduced.embeddings.shape == (7, store.embeddings.shape[1])
    assert (reduced.embeddings[3] == store.embeddings[3]).all()  # u3's row moved with it
    assert all("u4" not in t.unit_ids for t in reduced.traces)  # no trajectory points at a removed state
    assert reduced.unit("u3").trace_id is None or len(reduced.trace_of(reduced.unit("u3")).unit_ids) >= 2
    assert ([u.trace_id for u in store.units], [t.unit_ids for t in store.traces]) == before  # untouched
    assert reduced.meta["ablated_units"] == 1
    from qgmem.memory.source_turns import source_turn_embeddings

    store.source_embeddings = source_turn_embeddings(store.units, encoder)
    reduced = without_units(store, {"u4"}, encoder.encode, ConstructionConfig())
    assert reduced.source_embeddings.shape == (7, store.embeddings.shape[1])
    assert (reduced.source_embeddings[4] == store.source_embeddings[5]).all()  # u5's source row moved with it


def test_evidence_only_nodes_leave_out_nodes_other_units_also_give():
    units = [make_unit("a", "Ana lives in Lisbon", "Ana", "lives in", "Lisbon", ["t1"]),
             make_unit("b", "Ana likes tea", "Ana", "likes", "tea", ["t2"])]
    graph = LocalGraph(node_text=["Ana", "Lisbon", "tea"], edge_index=[(0, 1), (0, 2)], edge_text=["lives in", "likes"],
                       edge_unit=[0, 1])
    assert evidence_only_nodes(graph, units, {"a"}) == {"lisbon"}  # Ana also comes from unit b
    assert evidence_only_nodes(graph, units, set()) == set()


def _nearest_free_ranks(ranked_ids, drop, sham):
    """For each evidence rank, is the sham unit nearest in rank (lower-ranked on a tie) among those chosen?"""
    free = [r for r, u in enumerate(ranked_ids) if u not in drop]
    picked = []
    for r in (r for r, u in enumerate(ranked_ids) if u in drop):
        best = min(free, key=lambda f: (abs(f - r), -f))
        free.remove(best)
        picked.append(ranked_ids[best])
    return set(picked) <= sham


def test_sham_removes_as_many_non_evidence_units_at_the_evidence_ranks():
    store = build_small_store(HashEncoder())
    memory = [store.unit(i) for i in ("u5", "u2", "u7", "u0", "u3")]  # the own working memory, ranked
    drop = {"u2", "u6"}  # u2 at rank 1 of the working memory, u6 outside it
    sham, info = sham_unit_ids(store.units, memory, drop, seed="q1")
    # rank 1's neighbours u5 (rank 0) and u7 (rank 2) tie: the lower-ranked u7 is taken; u6's place goes
    # to a non-evidence unit outside the working memory (u1 or u4)
    assert "u7" in sham and len(sham) == 2 and not sham & drop
    assert sham - {"u7"} <= {"u1", "u4"}
    assert info == {"sham_units": 2, "sham_rank_matched": 1, "sham_short": 0}
    assert sham_unit_ids(store.units, memory, drop, seed="q1")[0] == sham  # seeded: the same every build
    assert _nearest_free_ranks([u.id for u in memory], drop, sham)
    # negative control: the check rejects a selection from the wrong ranks
    assert not _nearest_free_ranks([u.id for u in memory], drop, {"u5", "u1"})


def test_sham_never_takes_evidence_and_says_when_it_runs_short():
    store = build_small_store(HashEncoder())
    memory = [store.unit(i) for i in ("u0", "u1")]
    drop = {f"u{i}" for i in range(6)}  # six evidence units, two non-evidence units left (u6, u7)
    sham, info = sham_unit_ids(store.units, memory, drop)
    assert sham == {"u6", "u7"} and info["sham_short"] == 4 and info["sham_rank_matched"] == 0
