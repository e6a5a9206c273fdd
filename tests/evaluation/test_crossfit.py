"""Cross-fitting: folds grouped by conversation, histories that leak no held-out evidence, text dropout."""

from __future__ import annotations

import random

import numpy as np
import pytest

from qgmem.data.records import QA, Case, Dialogue, Session, Turn
from qgmem.evaluation.crossfit import (ANSWER_MODE_RULE, COMPACT_RULE, DEEP_READER_RULE, answer_contrasts, answer_mode, answer_scores,
                                       compact_choice, deep_reader_choice, validation_choice,
                                       assign_folds, evidence_conversations,
                                       fold_parts, graph_sizes, leaks, same_size_removals, with_distractors)

CATEGORIES = ["user_evidence", "changing_evidence", "preference_evidence"]


def _case(i: int, category: str, convs: list[str]) -> Case:
    sessions = [Session(id=c, turns=[Turn(id=f"{c}:{j}", session_id=c, speaker="u", role="user", text=f"{c} {j}")
                                     for j in range(2)]) for c in convs]
    qa = QA(id=f"case{i}#q0", question="q?", answer="a", category=category, evidence_turn_ids=[f"{convs[0]}:1"])
    return Case(id=f"case{i}", dialogue=Dialogue(id=f"case{i}", sessions=sessions), qas=[qa],
                source={"evidence_session_ids": list(convs), "person_id": "p"})


@pytest.fixture()
def cases() -> list[Case]:
    out = [_case(i, CATEGORIES[i % 3], [f"c{i}"]) for i in range(30)]
    out.append(_case(30, "user_evidence", ["c0b", "c1"]))  # shares c1 with case1: one group
    return out


def _scored(cases):
    return [c.id for c in cases if c.qas[0].category != "preference_evidence"]


def test_folds_keep_a_conversation_in_one_fold_and_balance_categories(cases):
    folds = assign_folds(cases, _scored(cases), k=5, seed=0)
    assert set(folds) == set(_scored(cases)) and set(folds.values()) == set(range(5))
    assert folds["case30"] == folds["case1"]  # they share conversation c1
    owner = {}
    for cid, f in folds.items():
        for conv in evidence_conversations(next(c for c in cases if c.id == cid)):
            assert owner.setdefault(conv, f) == f
    per_fold = np.bincount(list(folds.values()), minlength=5)
    assert per_fold.max() - per_fold.min() <= 2


def test_histories_hold_no_held_out_evidence(cases):
    folds = assign_folds(cases, _scored(cases), k=5, seed=0)
    mixed = with_distractors(cases, folds, n=2, seed=0)
    assert all(len(c.dialogue.sessions) == len(cases[i].dialogue.sessions) + 2 for i, c in enumerate(mixed))
    assert leaks(mixed, folds) == []
    for before, after in zip(cases, mixed):  # the gold turns are still in the history, under the same ids
        turns = {t.id for t in after.dialogue.turns()}
        assert set(after.qas[0].evidence_turn_ids) <= turns
        assert before.dialogue.num_turns() + 4 == after.dialogue.num_turns()


def test_leak_check_finds_the_loaders_own_draw(cases):
    """Negative control: distractors drawn from the whole pool (as the loader does) put held-out evidence
    in training histories, and the check says where."""
    folds = assign_folds(cases, _scored(cases), k=5, seed=0)
    rng = random.Random(0)
    whole_pool = [c for case in cases for c in case.dialogue.sessions]
    naive = []
    for case in cases:
        other = [s for s in whole_pool if s.id not in evidence_conversations(case)]
        naive.append(Case(id=case.id, qas=case.qas, source=case.source,
                          dialogue=Dialogue(id=case.id, sessions=case.dialogue.sessions + rng.sample(other, 2))))
    found = leaks(naive, folds)
    assert found
    fold, training_case, conv = found[0]
    assert folds.get(training_case) != fold
    assert any(conv in evidence_conversations(c) and folds[c.id] == fold for c in cases if c.id in folds)


def test_fold_parts_are_disjoint_and_cover_every_case(cases):
    folds = assign_folds(cases, _scored(cases), k=5, seed=0)
    ids = [c.id for c in cases]
    parts = fold_parts(folds, 2, 5, ids)
    assert sorted(parts["train"] + parts["val"] + parts["test"]) == sorted(ids)
    assert {folds[c] for c in parts["test"]} == {2} and {folds[c] for c in parts["val"]} == {3}
    assert {c for c in parts["train"] if c not in folds} == {c.id for c in cases if c.id not in folds}


def test_answer_scores_per_question():
    s = answer_scores(["Paris", "I don't know", "blue car"], ["Paris", "There is no information.", "a red car"])
    assert s["em"] == [1.0, 0.0, 0.0] and s["f1"][0] == 1.0 and 0 < s["f1"][2] < 1
    assert s["judge"][0] == 1.0 and s["judge"][2] == 0.0


def _graph(nodes: int, edges: int):
    from torch_geometric.data import Data
    import torch

    return Data(x=torch.zeros(nodes, 2), edge_index=torch.zeros(2, edges, dtype=torch.long))


def test_same_size_removals_keeps_only_equal_ablated_and_sham_graphs():
    counterfactuals = {"equal": {"ablated_graph": _graph(5, 4), "sham_graph": _graph(5, 4)},
                       "fewer_edges": {"ablated_graph": _graph(5, 3), "sham_graph": _graph(5, 4)},  # negative control
                       "fewer_nodes": {"ablated_graph": _graph(4, 4), "sham_graph": _graph(5, 4)},
                       "no_sham": {"ablated_graph": _graph(5, 4)},
                       "no_ablation": {}}
    items = [{"qa_id": q} for q in [*counterfactuals, "not_in_the_table"]]
    assert same_size_removals(items, counterfactuals) == ["equal"]


def test_graph_sizes_pair_the_own_graph_with_the_table_of_the_same_question():
    counterfactuals = {"a": {"ablated_graph": _graph(3, 1), "sham_graph": _graph(4, 2)},
                       "b": {"ablated_graph": _graph(5, 3), "sham_graph": _graph(6, 3)},
                       "c": {"ablated_graph": _graph(5, 3)}}  # no sham: left out
    items = [{"qa_id": "a", "graph": _graph(4, 2)}, {"qa_id": "b", "graph": _graph(6, 4)},
             {"qa_id": "c", "graph": _graph(9, 9)}, {"qa_id": "d", "graph": _graph(9, 9)}]
    out = graph_sizes(items, counterfactuals)
    assert out["n"] == 2
    assert (out["nodes"]["own"], out["nodes"]["ablated"], out["nodes"]["sham"]) == (5.0, 4.0, 5.0)
    assert (out["edges"]["own"], out["edges"]["ablated"], out["edges"]["sham"]) == (3.0, 2.0, 2.5)


def _units(values):
    return {f"{i // 2}-{i % 2}": v for i, v in enumerate(values)}


def test_validation_choice_needs_a_lower_mean_and_7_of_10_lower_units():
    base = _units([2.0] * 10)
    winner = _units([1.9] * 7 + [2.05] * 3)  # lower in 7, mean 1.945
    few = _units([1.5] * 6 + [2.01] * 4)  # a much lower mean, but lower in 6 only
    higher = _units([1.99] * 7 + [2.2] * 3)  # lower in 7, mean higher
    out = validation_choice(base, {"a": winner, "b": few, "c": higher}, units=10)
    assert out["need_lower_in"] == 7 and out["decided"]
    assert {n: r["status"] for n, r in out["candidates"].items()} == {"a": "wins", "b": "cannot win", "c": "cannot win"}
    assert out["chosen"] == "a" and out["candidates"]["a"]["lower_in"] == 7
    assert out["candidates"]["a"]["mean"] == pytest.approx(1.945)


def test_validation_choice_keeps_the_baseline_without_a_winner_and_picks_the_lowest_of_several():
    base = _units([2.0] * 10)
    assert validation_choice(base, {"x": _units([2.1] * 10)}, units=10)["chosen"] is None
    two = validation_choice(base, {"x": _units([1.9] * 10), "y": _units([1.8] * 10)}, units=10)
    assert two["chosen"] == "y"


def test_validation_choice_on_partial_units_is_open_until_it_cannot_win():
    base = _units([2.0] * 10)
    partial = {u: v for u, v in _units([2.1] * 4).items()}  # 4 units, none lower: 6 left cannot give 7
    some = {u: v for u, v in _units([1.9] * 4).items()}  # 4 lower, 6 left: still open
    out = validation_choice(base, {"p": partial, "s": some}, units=10)
    assert out["candidates"]["p"]["status"] == "cannot win" and out["candidates"]["s"]["status"] == "open"
    assert not out["decided"] and out["chosen"] is None


def _figures(nll, f1):
    return {f"{i // 2}-{i % 2}": {"nll": a, "f1": b} for i, (a, b) in enumerate(zip(nll, f1))}


def test_compact_choice_takes_the_lowest_validation_nll_then_compares_it_with_the_product():
    product = _figures([2.0] * 4, [0.20] * 4)
    answer = _figures([1.95, 2.0, 1.9, 2.05], [0.20, 0.22, 0.19, 0.21])  # mean NLL 1.975, F1 0.205
    full = _figures([1.9, 1.9, 2.0, 2.0], [0.18, 0.18, 0.2, 0.2])  # mean NLL 1.95 (chosen), F1 0.19: worse
    out = compact_choice(product, {"m3-answer": answer, "m3-full": full}, units=4)
    assert out["rule"] == COMPACT_RULE and out["decided"] and out["chosen"] == "m3-full"
    c = out["comparison"]
    assert c["units"] == 4 and c["nll"]["chosen_minus_product"] == pytest.approx(-0.05)
    assert c["f1"]["chosen"] == pytest.approx(0.19) and c["f1"]["chosen_minus_product"] == pytest.approx(-0.01)
    assert out["compact_default"] is False  # lower NLL but lower F1: not the default
    ties = compact_choice(product, {"m3-answer": _figures([2.0] * 4, [0.2] * 4)}, units=4)
    assert ties["compact_default"] is True  # equal on both is "not worse"
    worse_nll = compact_choice(product, {"m3-answer": _figures([2.01] * 4, [0.3] * 4)}, units=4)
    assert worse_nll["compact_default"] is False


def test_compact_choice_waits_for_every_unit():
    product = _figures([2.0] * 4, [0.2] * 4)
    partial = dict(list(_figures([1.0] * 4, [0.9] * 4).items())[:3])  # 3 of 4 units: not chosen yet
    out = compact_choice(product, {"m3-full": partial, "m3-answer": _figures([2.1] * 4, [0.2] * 4)}, units=4)
    assert out["chosen"] == "m3-answer" and not out["decided"] and out["compact_default"] is False
    assert out["candidates"]["m3-full"] == {"units": 3, "complete": False, "val_nll_mean": 1.0,
                                            "val_f1_mean": pytest.approx(0.9),
                                            "paired_with_product": {"units": 3, "nll_minus_product": -1.0,
                                                                    "f1_minus_product": pytest.approx(0.7)}}
    short_product = compact_choice(dict(list(product.items())[:2]), {"m3-answer": _figures([1.0] * 4, [0.9] * 4)},
                                   units=4)
    assert short_product["comparison"]["units"] == 2 and short_product["compact_default"] is None
    paired = short_product["candidates"]["m3-answer"]["paired_with_product"]  # over the 2 shared units only
    assert paired == {"units": 2, "nll_minus_product": -1.0, "f1_minus_product": pytest.approx(0.7)}
    none_shared = compact_choice({}, {"m3-answer": partial}, units=4)["candidates"]["m3-answer"]
    assert none_shared["paired_with_product"] == {"units": 0, "nll_minus_product": None, "f1_minus_product": None}
    assert not short_product["decided"]


#: degenerate shares with and without the tokens, per form, where the tokens are not worse
EVEN = {"plain": {"token": 0.02, "none": 0.02}, "named": {"token": 0.01, "none": 0.03}}


@pytest.mark.parametrize("plain,named,expected", [
    (0.02, 0.0, "token"),     # not below zero in either form, and no more degenerate replies: the tokens ship
    (0.05, -0.002, "none"),   # lower in the named-speaker form alone: the text prompt is the default answer
    (-0.01, 0.03, "none"),    # lower in the plain form alone
    (None, 0.03, None),       # a form without every unit yet: not decided
])
def test_the_default_s_tokens_ship_only_if_neither_form_loses_f1(plain, named, expected):
    out = answer_mode("m3-answer", plain, named, EVEN)
    assert out["rule"] == ANSWER_MODE_RULE and out["graph_mode"] == expected
    assert out["f1_own_minus_none"] == {"plain": plain, "named": named} and out["degenerate_share"] == EVEN
    assert answer_mode(None, 0.1, 0.1, EVEN)["graph_mode"] is None  # no default chosen yet


def test_the_tokens_ship_only_if_their_replies_are_not_more_often_degenerate():
    """Issue 63's outside check: F1 not lower, but 44 of 150 replies degenerate with the tokens against 5
    without: the tokens do not ship. Without the shares a winning F1 decides nothing."""
    more = {**EVEN, "locomo_form": {"token": 44 / 150, "none": 5 / 150}}
    assert answer_mode("default", 0.01, 0.0, more)["graph_mode"] == "none"
    assert answer_mode("default", 0.01, 0.0, {"plain": {"token": 0.1, "none": 0.1}})["graph_mode"] == "token"
    assert answer_mode("default", 0.01, 0.0)["graph_mode"] is None
    assert answer_mode("default", 0.01, 0.0, {"plain": {"token": None, "none": 0.1}})["graph_mode"] is None
    assert answer_mode("default", -0.01, 0.0)["graph_mode"] == "none"  # F1 alone decides against the tokens


def test_answer_contrasts_against_a_fixed_reference_per_question():
    from qgmem.evaluation.protocol import SampleScores

    runs = [SampleScores(qa_id=["a", "b", "c"], group=["g1", "g2", "g3"], category=["x", "abstention_evidence", "x"],
                         answer=["red car", "no info", "blue"], nll={"own": [1.0, 1.0, 1.0]},
                         predictions={"own": ["red car", "no", "green"]}) for _ in range(2)]
    out = answer_contrasts(runs, "own", "text10", n_boot=200, against={"f1": [0.5, 1.0, 0.0], "em": [0, 0, 0],
                                                                     "judge": [0, 0, 0]})
    f1 = out["f1"]
    assert f1["own"] == pytest.approx((1.0 + 2 / 3 + 0.0) / 3) and f1["text10"] == pytest.approx(0.5)
    assert f1["diff"]["mean"] == pytest.approx((0.5 + (2 / 3 - 1.0) + 0.0) / 3) and f1["diff"]["n"] == 3
    assert f1["diff"]["without_abstention"]["mean"] == pytest.approx(0.25)
    assert set(f1["diff"]["per_category"]) == {"x", "abstention_evidence"}


def _held_out(sham_hi, shuffled_hi, plain, named):
    """A held-out summary with the figures the deep reader's rule reads."""
    return {"sham_vs_ablated": {"mean": sham_hi - 0.01, "ci95": [sham_hi - 0.02, sham_hi]},
            "own_vs_shuffled": {"mean": shuffled_hi - 0.01, "ci95": [shuffled_hi - 0.02, shuffled_hi]},
            "answers_own_vs_none": {"f1": {"diff": {"mean": plain}}},
            "answers_own_vs_none_named": {"f1": {"diff": {"mean": named}}}}


def test_the_deep_reader_ships_only_with_evidence_validation_and_answers():
    default = _figures([2.0] * 4, [0.20] * 4)
    good = _figures([1.9] * 4, [0.21] * 4)
    out = deep_reader_choice(default, {"kv3-full": good, "kv3-answer": _figures([1.8] * 4, [0.22] * 4)},
                             {"kv3-full": _held_out(-0.001, -0.002, 0.01, 0.0),
                              "kv3-answer": _held_out(+0.004, -0.002, 0.05, 0.05)}, units=4)
    assert out["rule"] == DEEP_READER_RULE and out["decided"]
    # the lower validation NLL does not choose a variant without evidence (its sham − ablated crosses zero)
    assert out["candidates"]["kv3-answer"]["evidence"]["shown"] is False and out["chosen"] == "kv3-full"
    r = out["candidates"]["kv3-full"]
    assert r["validation_vs_default"] == {"units": 4, "nll_minus_default": pytest.approx(-0.1),
                                          "f1_minus_default": pytest.approx(0.01), "not_worse": True}
    assert r["f1_own_minus_none"] == {"plain": 0.01, "named": 0.0, "not_below_zero": True} and r["passes"]
    assert out["outcome"] == "kv3-full becomes the default"
    # evidence, but the named-speaker form loses F1, or validation F1 is lower: not the default
    named_worse = deep_reader_choice(default, {"kv3-full": good}, {"kv3-full": _held_out(-0.001, -0.002, 0.01, -0.001)},
                                     units=4)
    assert named_worse["chosen"] is None and named_worse["outcome"].startswith("a variant shows evidence")
    lower_f1 = deep_reader_choice(default, {"kv3-full": _figures([1.9] * 4, [0.19] * 4)},
                                  {"kv3-full": _held_out(-0.001, -0.002, 0.01, 0.0)}, units=4)
    assert lower_f1["candidates"]["kv3-full"]["validation_vs_default"]["not_worse"] is False
    assert lower_f1["chosen"] is None
    none_shows = deep_reader_choice(default, {"kv3-full": good}, {"kv3-full": _held_out(-0.001, +0.001, 0.01, 0.0)},
                                    units=4)
    assert none_shows["outcome"] == "no variant shows evidence: kv_prefix stays a documented option"


def test_the_deep_reader_rule_waits_for_every_unit():
    default = _figures([2.0] * 4, [0.20] * 4)
    partial = dict(list(_figures([1.5] * 4, [0.3] * 4).items())[:2])  # fold 0 only
    out = deep_reader_choice(default, {"kv3-full": partial}, {"kv3-full": _held_out(-0.01, -0.01, 0.1, 0.1)}, units=4)
    r = out["candidates"]["kv3-full"]
    assert not out["decided"] and out["chosen"] is None and out["outcome"] == "not decided yet"
    assert r["passes"] is None and r["complete"] is False and r["evidence"]["shown"] is True  # reported, not decided
    assert r["validation_vs_default"]["units"] == 2
    missing = deep_reader_choice(default, {"kv3-full": _figures([1.9] * 4, [0.3] * 4)}, {}, units=4)
    assert missing["candidates"]["kv3-full"]["passes"] is None  # no held-out summary yet: nothing decided
    assert not missing["decided"] and missing["outcome"] == "not decided yet"
