"""The learning-check protocol: shuffled pairing, bootstrap statistics, the conditions on one model, controls."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch_geometric.data import Data

from qgmem.model.encoder import EncoderConfig
from qgmem.model.random_lm import save_random_lm
from qgmem.training.collate import GraphTextCollator
from qgmem.training.datamodule import synthetic_items
from qgmem.training.module import GenerationSettings, QGMemModule
from qgmem.evaluation.protocol import (SampleScores, derangement, graph_signature, hierarchical_bootstrap,
                                     paired_bootstrap, score_conditions, summarize, tie_report)
from qgmem.evaluation.controls import control_items


@pytest.mark.parametrize("sizes", [[1] * 7, [3, 1, 1, 1], [2, 2, 2], [4, 4], [5, 2, 2, 1]])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_derangement_never_pairs_a_sample_with_its_own_graph(sizes, seed):
    signatures = [f"g{k}" for k, size in enumerate(sizes) for _ in range(size)]
    partner = derangement(signatures, seed)
    assert sorted(partner) == list(range(len(signatures)))  # a permutation: every graph used once
    assert all(p != i and signatures[p] != signatures[i] for i, p in enumerate(partner))


@pytest.mark.parametrize("signatures", [["a"], ["a", "a", "a", "b"]])
def test_impossible_derangement_is_refused(signatures):
    with pytest.raises(ValueError, match="at least 2|share one identical graph"):
        derangement(signatures)


def test_graph_signature_sees_every_feature():
    g = Data(x=torch.randn(3, 4), edge_index=torch.tensor([[0, 1], [1, 2]]), edge_attr=torch.randn(2, 4),
             edge_fact=torch.randn(2, 4))
    assert graph_signature(g) == graph_signature(g.clone())
    for name in ("x", "edge_attr", "edge_fact"):
        other = g.clone()
        setattr(other, name, getattr(g, name) + 1)
        assert graph_signature(other) != graph_signature(g)
    assert tie_report([graph_signature(g), graph_signature(g.clone()), "x"]) == {
        "samples": 3, "distinct_graphs": 2, "samples_in_ties": 2, "largest_tie": 2}


def test_bootstrap_finds_a_known_difference():
    rng = np.random.default_rng(0)
    diffs = -0.5 + 0.3 * rng.standard_normal(60)
    r = paired_bootstrap(diffs, n_boot=4000)
    lo, hi = r["ci95"]
    assert hi < 0 and lo < -0.5 < hi and r["mean"] == pytest.approx(diffs.mean())


def test_bootstrap_of_a_zero_difference_contains_zero():
    x = np.random.default_rng(1).standard_normal(30)
    r = paired_bootstrap(np.concatenate([x, -x]), n_boot=4000)
    lo, hi = r["ci95"]
    assert r["mean"] == pytest.approx(0.0, abs=1e-12) and lo < 0 < hi


def test_bootstrap_over_groups_counts_correlated_samples_once():
    """Ten copies of each of 6 values: per-sample resampling is overconfident, group resampling is not."""
    values = np.random.default_rng(2).standard_normal(6) + 0.3
    diffs, groups = np.repeat(values, 10), np.repeat([f"d{i}" for i in range(6)], 10)
    naive, grouped = paired_bootstrap(diffs, n_boot=4000), paired_bootstrap(diffs, groups, n_boot=4000)
    assert grouped["groups"] == 6 and naive["groups"] == 60
    assert grouped["ci95"][1] - grouped["ci95"][0] > 2 * (naive["ci95"][1] - naive["ci95"][0])


def _scores(own, shuffled, none, categories):
    n = len(own)
    return SampleScores(qa_id=[f"q{i}" for i in range(n)], group=[f"d{i}" for i in range(n)], category=categories,
                        answer=["Green"] * n, nll={"own": list(own), "shuffled": list(shuffled), "none": list(none)},
                        predictions={"own": ["green"] * n, "none": ["blue"] * n, "shuffled": ["blue"] * n})


def test_summary_contrasts_over_seeds_and_categories():
    rng = np.random.default_rng(3)
    cats = ["a"] * 20 + ["b"] * 20
    runs = []
    for _ in range(3):
        base = 2 + rng.standard_normal(40)
        # category a: the own token is 0.4 better than shuffled; category b: no difference
        own = base - np.where(np.array(cats) == "a", 0.4, 0.0)
        runs.append(_scores(own, base, base + 1.0, cats))
    s = summarize(runs, n_boot=2000)
    assert s["seeds"] == 3 and s["n"] == 40 and s["per_category_n"] == {"a": 20, "b": 20}
    vs = s["own_vs_shuffled"]
    assert vs["mean"] == pytest.approx(-0.2) and vs["per_seed_mean"] == pytest.approx([-0.2] * 3)
    assert vs["per_category"]["a"]["ci95"] == pytest.approx([-0.4, -0.4])
    assert vs["per_category"]["b"]["ci95"] == pytest.approx([0.0, 0.0], abs=1e-12)
    assert s["own_vs_none"]["mean"] == pytest.approx(-1.2)
    assert "own_vs_ablated" not in s  # no ablated scores, no contrast
    assert s["em_f1"]["own"]["em"] == 1.0 and s["em_f1"]["none"]["f1"] == 0.0


def test_summary_pairs_ablated_only_where_a_sample_has_an_ablated_graph():
    own = [1.0, 2.0, 3.0, 4.0]
    run = _scores(own, own, own, ["x"] * 4)
    run.nll["ablated"] = [1.5, None, 3.5, None]
    s = summarize([run], n_boot=200)
    assert s["own_vs_ablated"]["n"] == 2 and s["own_vs_ablated"]["mean"] == pytest.approx(-0.5)
    assert s["nll"]["ablated"] == pytest.approx(2.5)


def test_hierarchical_bootstrap_excludes_zero_for_a_consistent_effect():
    """Positive case: every seed lowers the NLL by about 0.3."""
    rng = np.random.default_rng(4)
    diffs = -0.3 + 0.02 * rng.standard_normal(5)[:, None] + 0.2 * rng.standard_normal((5, 50))
    r = hierarchical_bootstrap(diffs, design="crossed", n_boot=4000)
    assert r["seeds"] == 5 and r["n"] == 50 and len(r["per_seed"]) == 5
    assert r["ci95"][1] < 0 and r["ci95"][0] < -0.3 < r["ci95"][1]
    assert all(p["ci95"][1] < 0 for p in r["per_seed"])


def test_hierarchical_bootstrap_keeps_the_seed_variance():
    """Negative case: seeds disagree in sign. A bootstrap over seed-averaged samples is falsely sure."""
    rng = np.random.default_rng(5)
    seed_means = np.array([-0.30, 0.25, -0.10, 0.15, -0.05])
    diffs = seed_means[:, None] + 0.01 * rng.standard_normal((5, 50))
    flat = paired_bootstrap(diffs.mean(0), n_boot=4000)
    assert flat["ci95"][1] < 0  # the old interval excludes 0 ...
    r = hierarchical_bootstrap(diffs, design="crossed", n_boot=4000)
    assert r["ci95"][0] < 0 < r["ci95"][1]  # ... the hierarchical one does not
    assert [p["mean"] for p in r["per_seed"]] == pytest.approx(list(seed_means), abs=0.01)


def test_hierarchical_bootstrap_resamples_groups():
    values = np.random.default_rng(6).standard_normal(6) + 0.3
    diffs = np.tile(np.repeat(values, 10), (2, 1))
    groups = np.repeat([f"d{i}" for i in range(6)], 10)
    naive = hierarchical_bootstrap(diffs, design="crossed", n_boot=3000)
    grouped = hierarchical_bootstrap(diffs, groups, design="crossed", n_boot=3000)
    assert grouped["groups"] == 6 and naive["groups"] == 60
    assert grouped["ci95"][1] - grouped["ci95"][0] > 2 * (naive["ci95"][1] - naive["ci95"][0])


def test_summary_refuses_runs_over_other_samples():
    a = _scores([1.0, 2.0], [1.0, 2.0], [1.0, 2.0], ["x", "x"])
    b = _scores([1.0, 2.0], [1.0, 2.0], [1.0, 2.0], ["x", "x"])
    b.qa_id = ["q1", "q0"]
    with pytest.raises(ValueError, match="different samples"):
        summarize([a, b])


# ---------------------------------------------------------------------------------------- a tiny run

@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from qgmem.lm import load_tokenizer

    lm = str(save_random_lm(tmp_path_factory.mktemp("lm") / "tiny", hidden_size=32, layers=2))
    torch.manual_seed(0)
    module = QGMemModule(lm=lm, feature_dim=8, encoder=EncoderConfig(hidden=16, heads=2, layers=1, dropout=0.0),
                         generation=GenerationSettings(max_new_tokens=3), features="edge_fact_sum", readout="queries", num_graph_tokens=2)
    return module, load_tokenizer(lm)


@pytest.mark.parametrize("graph_only", [False, True])
def test_three_conditions_on_one_model(tiny, graph_only):
    module, tok = tiny
    items = synthetic_items(6, 8, seed=4)
    collator = GraphTextCollator(tok, max_prompt_tokens=96, max_answer_tokens=8, include_memory_text=not graph_only)
    scores, pairing = score_conditions(module, items, collator, batch_size=4, generate=["own"])
    assert set(scores.nll) == {"own", "ablated", "sham", "shuffled", "norel", "none"}
    assert all(len(v) == 6 for v in scores.nll.values())
    assert scores.nll["ablated"] == [None] * 6 and pairing["with_ablated_graph"] == 0  # no ablated graphs here
    assert scores.nll["sham"] == [None] * 6 and pairing["with_sham_graph"] == 0
    assert pairing["shuffled_same_graph"] == 0 and pairing["distinct_graphs"] == 6
    assert len(scores.predictions["own"]) == 6 and "none" not in scores.predictions
    own, shuffled, none = (np.asarray(scores.nll[c]) for c in ("own", "shuffled", "none"))
    assert not np.allclose(own, shuffled) and not np.allclose(own, none)
    assert not np.allclose(own, np.asarray(scores.nll["norel"]))  # the edge features reach the token
    # scoring one item alone gives the same NLL: batching and padding do not leak between samples
    alone, _ = score_conditions(module, items[:2], collator, batch_size=1, conditions=["own", "none"])
    np.testing.assert_allclose(alone.nll["own"], own[:2], atol=1e-5)
    np.testing.assert_allclose(alone.nll["none"], none[:2], atol=1e-5)


def test_a_token_that_ignores_the_graph_shows_no_difference(tiny):
    """A soft prompt (same token for every graph) gives own − shuffled = 0 exactly, and an interval on 0."""
    module, tok = tiny
    items = synthetic_items(6, 8, seed=5)
    collator = GraphTextCollator(tok, max_prompt_tokens=96, max_answer_tokens=8)
    last = module.net.projector.net[-1]
    saved = last.weight.detach().clone()
    with torch.no_grad():
        last.weight.zero_()  # the token is now the bias: one learned vector whatever the graph
    try:
        scores, _ = score_conditions(module, items, collator, batch_size=3, seed=1)
    finally:
        with torch.no_grad():
            last.weight.copy_(saved)
    s = summarize([scores], n_boot=500)
    lo, hi = s["own_vs_shuffled"]["ci95"]
    assert abs(s["own_vs_shuffled"]["mean"]) < 1e-5 and lo <= 1e-5 and hi >= -1e-5  # contains 0
    assert s["own_vs_none"]["mean"] != pytest.approx(0.0, abs=1e-4)  # the learned vector itself still matters


def test_identical_graphs_are_never_each_others_shuffle(tiny):
    module, tok = tiny
    items = synthetic_items(6, 8, seed=6)
    for i in (1, 2):  # three samples share one graph
        items[i]["graph"] = Data(**{k: v.clone() for k, v in items[0]["graph"].items()})
        items[i]["node_text"] = list(items[0]["node_text"])
    collator = GraphTextCollator(tok, max_prompt_tokens=96, max_answer_tokens=8)
    _, pairing = score_conditions(module, items, collator, batch_size=6, conditions=["own", "shuffled"])
    assert pairing["samples_in_ties"] == 3 and pairing["shuffled_same_graph"] == 0


def test_shuffled_graph_brings_its_own_node_words(tmp_path):
    """With ``node_words`` features a shuffled graph is scored with its own words, not the sample's."""
    from qgmem.lm import load_tokenizer

    lm = str(save_random_lm(tmp_path / "lm", hidden_size=32, layers=1))
    torch.manual_seed(0)
    module = QGMemModule(lm=lm, feature_dim=8, encoder=EncoderConfig(hidden=16, heads=2, layers=1, dropout=0.0),
                         generation=GenerationSettings(max_new_tokens=3), features="node_words", readout="nodes", num_graph_tokens=3)
    items = synthetic_items(6, 8, seed=7, max_nodes=5)
    assert len({len(it["node_text"]) for it in items}) > 1  # graphs of different sizes get paired
    collator = GraphTextCollator(load_tokenizer(lm), max_prompt_tokens=96, max_answer_tokens=8,
                                 include_memory_text=False)
    scores, pairing = score_conditions(module, items, collator, batch_size=3)
    assert pairing["shuffled_same_graph"] == 0
    assert not np.allclose(scores.nll["own"], scores.nll["shuffled"])
    # shuffled = the sample's own prompt with the partner's graph AND the partner's node words
    partner = derangement([graph_signature(it["graph"]) for it in items], 0)
    swapped = [{**it, "graph": items[p]["graph"], "node_text": items[p]["node_text"]} for it, p in zip(items, partner)]
    words_kept = [{**it, "graph": items[p]["graph"]} for it, p in zip(items, partner)]
    both, _ = score_conditions(module, swapped, collator, batch_size=3, conditions=["own"])
    np.testing.assert_allclose(scores.nll["shuffled"], both.nll["own"], atol=1e-5)
    with pytest.raises(ValueError, match="node texts"):  # a negative control: the graph without its words
        score_conditions(module, words_kept, collator, batch_size=3, conditions=["own"])


def test_ablated_condition_scores_the_ablated_graph_with_its_own_node_words(tmp_path):
    from qgmem.lm import load_tokenizer

    lm = str(save_random_lm(tmp_path / "lm", hidden_size=32, layers=1))
    torch.manual_seed(0)
    module = QGMemModule(lm=lm, feature_dim=8, encoder=EncoderConfig(hidden=16, heads=2, layers=1, dropout=0.0),
                         generation=GenerationSettings(max_new_tokens=3), features="node_words", readout="nodes", num_graph_tokens=4)
    items, counterfactuals = control_items(5, 8, kind="positive")
    del counterfactuals[items[4]["qa_id"]]  # one sample without
    collator = GraphTextCollator(load_tokenizer(lm), max_prompt_tokens=96, max_answer_tokens=8,
                                 include_memory_text=False)
    scores, pairing = score_conditions(module, items, collator, batch_size=2, conditions=["own", "ablated"],
                                       counterfactuals=counterfactuals)
    assert pairing["with_ablated_graph"] == 4 and scores.nll["ablated"][4] is None
    assert all(a is not None and abs(a - o) > 1e-6 for a, o in zip(scores.nll["ablated"][:4], scores.nll["own"][:4]))


def test_control_items_differ_only_in_the_answer_node():
    for kind in ("positive", "negative"):
        items, counterfactuals = control_items(8, 8, kind=kind, seed=1)
        assert list(counterfactuals) == [it["qa_id"] for it in items]
        for it in items:
            c = counterfactuals[it["qa_id"]]
            own, ablated = it["graph"], c["ablated_graph"]
            assert graph_signature(own) != graph_signature(ablated)
            assert torch.equal(own.x[1:], ablated.x[1:]) and torch.equal(own.edge_index, ablated.edge_index)
            assert it["node_text"][1:] == c["ablated_node_text"][1:]
            assert c["ablated_node_text"][0] != it["answer"]
            assert (it["node_text"][0] == it["answer"]) == (kind == "positive")


def _aligned_control_scores(kind: str, seeds=(0, 1)):
    """Node-token models aligned (no answer training) on control items, scored graph-only: own vs ablated."""
    from qgmem.lm import EMBEDDED_LM, load_tokenizer

    runs = []
    tok = load_tokenizer(EMBEDDED_LM)
    for seed in seeds:
        torch.manual_seed(seed)
        module = QGMemModule(lm=EMBEDDED_LM, feature_dim=8, features="node_words", readout="nodes", num_graph_tokens=4,
                             encoder=EncoderConfig(hidden=64, heads=2, layers=1, dropout=0.0))
        collator = GraphTextCollator(tok, max_prompt_tokens=96, max_answer_tokens=8, include_memory_text=False,
                                     system_prompt=None)
        from qgmem.training.alignment import align_node_tokens

        train, _ = control_items(48, 8, kind=kind, seed=100 + seed)
        align_node_tokens(module.net, train, collator, module.lm.get_input_embeddings().weight, steps=150,
                          batch_size=16, lr=3e-3, seed=seed)
        test, counterfactuals = control_items(16, 8, kind=kind, seed=7)
        scores, _ = score_conditions(module, test, collator, batch_size=8, conditions=["own", "ablated"],
                                     counterfactuals=counterfactuals)
        runs.append(scores)
    return summarize(runs, n_boot=2000)["own_vs_ablated"]


@pytest.mark.slow
def test_positive_control_own_beats_ablated_strongly():
    """Answer = one node's text: a model that can read node texts must lose much NLL when that node goes."""
    r = _aligned_control_scores("positive")
    assert r["ci95"][1] < -0.3 and r["mean"] < -0.5, r


@pytest.mark.slow
def test_negative_control_random_node_features_give_no_difference():
    """No node holds the answer: own − ablated must be indistinguishable from 0."""
    r = _aligned_control_scores("negative")
    assert r["ci95"][0] < 0 < r["ci95"][1], r


def test_summary_reports_the_sham_contrasts_and_a_pooled_figure_without_abstention():
    own = [1.0, 1.0, 1.0, 1.0]
    run = _scores(own, own, own, ["abstention_evidence", "abstention_evidence", "user_evidence", "user_evidence"])
    run.nll["ablated"] = [1.5, 1.5, 1.1, 1.1]
    run.nll["sham"] = [1.2, 1.2, 1.0, 1.0]
    s = summarize([run], n_boot=200)
    assert s["sham_vs_ablated"]["mean"] == pytest.approx(-0.2)
    assert s["own_vs_sham"]["mean"] == pytest.approx(-0.1)
    # without abstention only the two user questions count: the sham equals own there
    assert s["own_vs_sham"]["without_abstention"]["mean"] == pytest.approx(0.0)
    assert s["sham_vs_ablated"]["without_abstention"]["mean"] == pytest.approx(-0.1)


def test_sample_scores_only_keeps_the_chosen_questions_in_order():
    from qgmem.evaluation.protocol import SampleScores

    s = SampleScores(qa_id=["a", "b", "c"], group=["g1", "g2", "g1"], category=["x", "y", "x"], answer=["1", "2", "3"],
                     nll={"own": [0.1, 0.2, 0.3], "none": [1.0, 2.0, 3.0]}, predictions={"own": ["p", "q", "r"]})
    sub = s.only(["c", "a", "zzz"])
    assert sub.qa_id == ["a", "c"] and sub.group == ["g1", "g1"] and sub.answer == ["1", "3"]
    assert sub.nll == {"own": [0.1, 0.3], "none": [1.0, 3.0]} and sub.predictions == {"own": ["p", "r"]}
    assert s.only([]).qa_id == [] and s.qa_id == ["a", "b", "c"]  # the original is untouched
