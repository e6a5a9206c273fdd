"""The compact prompt's study in ``bench/studies/graph_token/crossfit.py``: its named variants' settings, the
summary's budgets and contrasts (own − text-10 joined by question id), and the named rule, on hand-made
unit records (no training, no LM)."""

from __future__ import annotations

import inspect
import json

import pytest
import torch
from torch_geometric.data import Data

from bench_script import load_bench_script
from qgmem.training.module import QGMemModule

X = load_bench_script("bench.studies.graph_token.crossfit")
CATEGORIES = ["abstention_evidence", "user_evidence"]


def test_the_named_variants_resolve_to_their_module_data_and_training_settings(tmp_path):
    setting = X.product_setting(str(X.REPO / "configs" / "nodes10.yaml"))
    product = X.unit_settings(setting, X.variant_of("product"), tmp_path)
    assert product["data"] == {"batch_size": 4, "eval_batch_size": 8, "max_prompt_tokens": 288, "max_answer_tokens": 48}
    assert (product["max_steps"], product["val_check_interval"], product["patience"]) == (30, 15, None)
    assert "readout" not in product["model"]  # the preset's own readout
    answer = X.unit_settings(setting, X.variant_of("m3-answer"), tmp_path)
    assert answer["data"] == {**product["data"], "memory_units": 3}  # the text budget, same prompt cap
    assert {k: answer["model"][k] for k in ("readout", "num_graph_tokens")} == {"readout": "summary_units",
                                                                              "num_graph_tokens": 11}
    assert answer["model"]["stages"] == setting["model"]["stages"]  # today's recipe: the product's stages
    assert (answer["max_steps"], answer["val_check_interval"], answer["patience"]) == (120, 10, 2)
    full = X.unit_settings(setting, X.variant_of("m3-full"), tmp_path)
    assert full["model"]["stages"] == [
        {"class_path": "qgmem.training.stages.MemoryReconstruction", "init_args": {"steps": 150, "batch_size": 8}},
        {"class_path": "qgmem.training.stages.Distillation",
         "init_args": {"weight": 2.0, "topk": 16, "cache_dir": str(tmp_path / "teacher")}}]
    assert "cache_dir" not in X.STAGE2["init_args"]  # the unit's copy got it, not the shared record
    recon = X.unit_settings(setting, X.variant_of("m3-recon"), tmp_path)
    assert [s["class_path"].rsplit(".", 1)[1] for s in recon["model"]["stages"]] == ["MemoryReconstruction"]
    k20 = X.variant_of("m3-full-k20")
    assert (k20["text_units"], k20["graph_units"], k20["model"]["num_graph_tokens"]) == (3, 20, 21)
    assert X.variant_of("product")["graph_units"] is None and not X.variant_of("td0.5-1")["named_form"]
    with pytest.raises(SystemExit, match="unknown variant 'm5'"):
        X.variant_of("m5")


def test_every_compact_variants_module_settings_are_module_parameters(tmp_path):
    from qgmem.training.stages import as_stage, check_stages

    known = set(inspect.signature(QGMemModule).parameters)
    setting = X.product_setting(str(X.REPO / "configs" / "nodes10.yaml"))
    for name in X.COMPACT:
        model = X.unit_settings(setting, X.variant_of(name), tmp_path)["model"]
        assert set(model) <= known, name
        check_stages([as_stage(s) for s in model["stages"]])  # each record builds a stage in range


def _scores(qa, cats, nll, preds):
    return {"qa_id": qa, "group": [f"g{q}" for q in qa], "category": cats, "answer": ["red car"] * len(qa),
            "nll": nll, "predictions": preds}


def _write_units(root, variant, folds=2, seeds=(0, 1), per_fold=4):
    """Unit records of ``variant`` as run_unit writes them: questions q0..q7, own 0.5 lower than none."""
    folder = root / "runs" / variant
    folder.mkdir(parents=True)
    for f in range(folds):
        qa = [f"q{f * per_fold + i}" for i in range(per_fold)]
        cats = [CATEGORIES[i % 2] for i in range(per_fold)]
        for s in seeds:
            base = [1.0 + 0.1 * i + 0.01 * s for i in range(per_fold)]
            nll = {"own": [b - 0.5 for b in base], "ablated": [b - 0.4 for b in base], "sham": [b - 0.45 for b in base],
                   "shuffled": [b - 0.3 for b in base], "none": base}
            preds = {"own": ["red car"] * per_fold, "none": ["blue"] * per_fold}
            unit = {"variant": variant, "fold": f, "seed": s, "scores": _scores(qa, cats, nll, preds),
                    "named": _scores(qa, cats, {"own": base, "none": base},
                                     {"own": ["red"] * per_fold, "none": ["red car"] * per_fold}),
                    "val_nll_best": 2.0 + 0.1 * f, "val_f1": 0.3, "steps": 120, "steps_run": 40 + f, "train_s": 1.0,
                    "score_s": 1.0, "num_graph_tokens": 11, "prompt_text_tokens": [100 + 10 * i for i in range(per_fold)],
                    "prompts_trimmed": f}
            (folder / f"fold-{f}-seed-{s}.json").write_text(json.dumps(unit))
    items = {f"q{i}": {"qa_id": f"q{i}", "graph": Data(x=torch.zeros(2, 3), edge_index=torch.tensor([[0], [1]]))}
             for i in range(folds * per_fold)}
    return items


def test_the_summary_records_budgets_contrasts_text10_and_prompt_tokens(tmp_path):
    items = _write_units(tmp_path, "m3-full")
    text10 = {f"q{i}": {"nll": 0.7, "f1": 0.5, "em": 0.0, "judge": 1.0, "prompt_tokens": 300} for i in range(7)}
    s = X.summary(tmp_path, X.variant_of("m3-full"), [0, 1], 2, items, {}, 200, graph_units=10, text10=text10)
    assert (s["text_units"], s["graph_units"], s["n"]) == (3, 10, 8)
    for key in ("own_vs_none", "own_vs_ablated", "sham_vs_ablated", "own_vs_text10"):
        r = s[key]
        assert {"mean", "ci95", "n", "per_category", "without_abstention"} <= set(r), key
    assert s["own_vs_none"]["mean"] == pytest.approx(-0.5) and s["sham_vs_ablated"]["mean"] == pytest.approx(-0.05)
    # q7 has no text-10 row: left out of own − text10 only, and counted
    assert s["text10_missing"] == 1 and s["text10_joined"] == 7 and s["own_vs_text10"]["n"] == 7
    own = [1.0 + 0.1 * (i % 4) + 0.005 - 0.5 for i in range(7)]  # the mean of the two seeds
    assert s["own_vs_text10"]["mean"] == pytest.approx(sum(o - 0.7 for o in own) / 7)
    f1 = s["answers_own_vs_text10"]["f1"]
    assert (f1["own"], f1["text10"], f1["diff"]["n"]) == (pytest.approx(1.0), pytest.approx(0.5), 7)
    assert set(f1["diff"]["per_category"]) == set(CATEGORIES) and "without_abstention" in f1["diff"]
    assert s["answers_own_vs_none"]["f1"]["diff"]["mean"] == pytest.approx(1.0)
    named = s["answers_own_vs_none_named"]["f1"]  # "red" against "red car": F1 2/3, none exact
    assert named["diff"]["mean"] == pytest.approx(2 / 3 - 1.0)
    assert s["prompt_tokens"] == {**{c: {"text": 115.0, "graph": 11, "all": 126.0} for c in X.CONDITIONS
                                     if c != "none"}, "none": {"text": 115.0, "graph": 0, "all": 115.0},
                                  "text10": {"text": 300.0, "graph": 0, "all": 300.0}}
    assert s["prompts_trimmed"] == 1 and s["steps_run"] == {"0-0": 40, "0-1": 40, "1-0": 41, "1-1": 41}
    assert s["val_f1"] == {u: 0.3 for u in ("0-0", "0-1", "1-0", "1-1")}
    plain = X.summary(tmp_path, X.variant_of("m3-full"), [0, 1], 2, items, {}, 200, graph_units=10)
    assert "own_vs_text10" not in plain and "text10_missing" not in plain


def test_text10_rows_are_read_by_question_and_bad_files_exit_2(tmp_path, capsys):
    path = tmp_path / "scores.jsonl"
    rows = [{"qa_id": "a", "units": {"3": {"nll": 2.0}, "10": {"nll": 1.0, "f1": 0.5}}},
            {"qa_id": "b", "units": {"10": {"nll": 1.5, "f1": 0.0}}}]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows) + '{"qa_id": "c", "un')  # a torn last line
    assert X.read_text10(path) == {"a": {"nll": 1.0, "f1": 0.5}, "b": {"nll": 1.5, "f1": 0.0}}
    path.write_text(json.dumps({"qa_id": "a", "units": {"3": {"nll": 2.0}}}) + "\n")
    with pytest.raises(SystemExit) as exit_:
        X.read_text10(path)
    assert exit_.value.code == 2 and "'a' has no 10-unit score" in capsys.readouterr().err
    path.write_text("not json\n" + json.dumps(rows[0]) + "\n")
    with pytest.raises(SystemExit):
        X.read_text10(path)
    assert "line 1 is not JSON" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        X.read_text10(tmp_path / "missing.jsonl")
    assert "missing.jsonl" in capsys.readouterr().err


def test_the_compact_choice_reads_the_units_and_writes_its_rule(tmp_path, capsys):
    def unit(variant, f, s, nll, f1):
        folder = tmp_path / "runs" / variant
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"fold-{f}-seed-{s}.json").write_text(json.dumps({"val_nll_best": nll, "val_f1": f1}))

    for f in range(2):
        for s in range(2):
            unit("product", f, s, 2.0, 0.20)
            unit("m3-answer", f, s, 1.9, 0.21)
            unit("m3-full", f, s, 1.8, 0.19)
    out = X.choose_compact(tmp_path, ["product", "m3-answer", "m3-full"], [0, 1], 2)
    assert out["chosen"] == "m3-full" and out["compact_default"] is False and out["decided"]  # lower F1
    assert out["rule"].startswith("Validation parts only.") and "compact prompt the default: False" in capsys.readouterr().out
    assert X.choose_compact(tmp_path, ["product", "td0.5-1"], [0, 1], 2) is None  # no compact variant named
    (tmp_path / "runs" / "m3-full" / "fold-1-seed-1.json").unlink()
    out = X.choose_compact(tmp_path, ["product", "m3-answer", "m3-full"], [0, 1], 2)
    assert out["chosen"] == "m3-answer" and out["compact_default"] is True and not out["decided"]


def test_ablated_and_sham_graphs_without_edge_units_are_counted():
    def graph(units):
        g = Data(x=torch.zeros(2, 3), edge_index=torch.tensor([[0, 1], [1, 0]]))
        if units is not None:
            g.edge_unit = torch.tensor(units)
        return g

    table = {"a": {"ablated_graph": graph([0, 1]), "sham_graph": graph(None)},  # a table of before: no edge_unit
             "b": {"ablated_graph": graph([-1, -1]), "sham_graph": graph([0, 0])},  # read back as unknown
             "c": {}, "d": {"ablated_graph": Data(x=torch.zeros(1, 3), edge_index=torch.zeros(2, 0, dtype=torch.long))}}
    assert X.without_edge_units(table) == 2  # a graph without edges has nothing to place


def test_the_deep_reader_variants_are_named_with_their_injection_and_budgets(tmp_path):
    setting = X.product_setting(str(X.REPO / "configs" / "default.yaml"))
    figures = {}
    for name in ("kv3-answer", "kv3-full", "kv0-full"):
        variant = X.variant_of(name)
        model = X.unit_settings(setting, variant, tmp_path)["model"]
        figures[name] = (variant["injection"], variant["text_units"], variant["graph_units"], model["num_graph_tokens"])
        assert model["injection"] == "kv_prefix", name
        assert "NodeWordAlignment" not in str(model["stages"]), name  # the word alignment fits input embeddings
    assert figures == {"kv3-answer": ("kv_prefix", 3, 10, 11), "kv3-full": ("kv_prefix", 3, 10, 11),
                       "kv0-full": ("kv_prefix", 0, 10, 11)}
    assert X.unit_settings(setting, X.variant_of("kv3-answer"), tmp_path)["model"]["stages"] == []
    for name in ("kv3-full", "kv0-full"):  # the full recipe: stage 1 reconstruction, stage 2 distillation
        model = X.unit_settings(setting, X.variant_of(name), tmp_path)["model"]
        assert [s["class_path"].rsplit(".", 1)[1] for s in model["stages"]] == ["MemoryReconstruction", "Distillation"]
        assert model["stages"][1]["init_args"]["weight"] == 2.0, name
    assert X.variant_of("m3-full")["injection"] == X.variant_of("product")["injection"] == "input"


def test_the_deep_readers_rule_reads_its_units_and_the_defaults(tmp_path, capsys):
    units = {f"{f}-{s}": {"nll": 2.0, "f1": 0.20} for f in range(2) for s in range(2)}
    default = tmp_path / "compact.json"
    default.write_text(json.dumps({"summaries": {X.DEFAULT_VARIANT: {
        "val_nll_best": {u: v["nll"] for u, v in units.items()}, "val_f1": {u: v["f1"] for u, v in units.items()}}}}))
    assert X.default_unit_figures(default) == units
    for f in range(2):
        for s in range(2):
            folder = tmp_path / "runs" / "kv3-full"
            folder.mkdir(parents=True, exist_ok=True)
            (folder / f"fold-{f}-seed-{s}.json").write_text(json.dumps({"val_nll_best": 1.9, "val_f1": 0.2}))
    held_out = {"kv3-full": {"sham_vs_ablated": {"ci95": [-0.002, +0.001]}, "own_vs_shuffled": {"ci95": [-0.01, -0.001]},
                             "answers_own_vs_none": {"f1": {"diff": {"mean": 0.03}}},
                             "answers_own_vs_none_named": {"f1": {"diff": {"mean": 0.01}}}}}
    out = X.choose_deep_reader(tmp_path, ["kv3-full", "m3-full"], [0, 1], 2, held_out, default)
    assert set(out["candidates"]) == {"kv3-full"}  # the input-level variants have the compact rule
    r = out["candidates"]["kv3-full"]
    assert r["validation_vs_default"]["nll_minus_default"] == pytest.approx(-0.1) and r["passes"] is False
    assert out["outcome"] == "no variant shows evidence: kv_prefix stays a documented option"
    printed = capsys.readouterr().out
    assert "| kv3-full | 4 | [-0.002, +0.001] | [-0.010, -0.001] | -0.1000 | +0.0000 (4) | +0.0300 / +0.0100 | False |" in printed
    assert X.choose_deep_reader(tmp_path, ["m3-full"], [0, 1], 2, held_out, default) is None
    default.write_text(json.dumps({"summaries": {"product": {}}}))
    with pytest.raises(SystemExit) as exit_:
        X.default_unit_figures(default)
    assert exit_.value.code == 2 and f"no per-unit validation figures of {X.DEFAULT_VARIANT}" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_:
        X.default_unit_figures(tmp_path / "missing.json")
    assert exit_.value.code == 2 and "missing.json" in capsys.readouterr().err
