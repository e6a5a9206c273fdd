"""``bench/studies/graph_token/crossfit.py`` end to end on a tiny ConvoMem-form set and a random LM.

Checks the promised JSON (every condition's contrasts with a pooled figure without abstention, greedy
answers own − none, graph sizes), that every usable question is scored once, and that a rerun reuses
what was recorded. It trains 2 steps per unit: nothing here says what the graph token adds.
"""

from __future__ import annotations

import json

import pytest
import yaml

from qgmem.model.random_lm import save_random_lm

from training.test_datamodule import write_convomem
from bench_script import load_bench_script

pytestmark = [pytest.mark.usefixtures("keep_torch_threads")]  # replays a small data set with the embedded sentence encoder




def _config(tmp_path):
    """A 2-step training of a random LM over a tiny ConvoMem-form set."""
    lm = save_random_lm(tmp_path / "lm", hidden_size=32, layers=1)
    cfg = {"trainer": {"accelerator": "cpu", "precision": "32-true", "gradient_clip_val": 1.0, "max_steps": 2,
                       "val_check_interval": 1},
           "model": {"lm": str(lm), "num_graph_tokens": 5,
                     "stages": [{"class_path": "qgmem.training.stages.NodeWordAlignment",
                                 "init_args": {"steps": 2, "batch_size": 4}}],
                     "generation": {"max_new_tokens": 4, "val_generate_batches": 0}},
           "data": {"data_path": str(write_convomem(tmp_path / "convomem", items_per_person=3)),
                    "cache_dir": str(tmp_path / "cache"), "distractor_conversations": 1, "batch_size": 2,
                    "max_prompt_tokens": 128, "max_answer_tokens": 8}}
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump(cfg))
    return config


def _has_readout(name: str) -> bool:
    from typing import get_args

    from qgmem.model.readout import Readout

    return name in get_args(Readout)


def test_crossfit_scores_every_usable_question_once_and_resumes(tmp_path, capsys):
    config = _config(tmp_path)
    script = load_bench_script("bench.studies.graph_token.crossfit")
    out = tmp_path / "summary.json"
    argv = ["--config", str(config), "--root", str(tmp_path / "root"), "--folds", "3", "--seeds", "0", "1",
            "--n-boot", "200", "--threads", "1", "--out", str(out)]
    assert script.main(argv) == 0
    first = capsys.readouterr().out
    assert "0 leaks" in first
    result = json.loads(out.read_text())
    s = result["summaries"]["product"]
    assert s["folds_done"] == [0, 1, 2] and s["seeds"] == [0, 1]
    assert s["n"] == result["scored_cases"] and len(set(s["per_category_n"])) == 1  # user questions only
    for key in ("own_vs_none", "own_vs_ablated", "own_vs_sham", "sham_vs_ablated", "own_vs_shuffled"):
        assert key in s and "without_abstention" in s[key], key
    assert s["own_vs_sham"]["n"] == s["own_vs_ablated"]["n"]  # the sham exists where the ablation does
    for metric in ("f1", "em", "judge"):
        assert {"own", "none", "diff"} <= set(s["answers_own_vs_none"][metric])
    assert s["graph_sizes"]["n"] == s["own_vs_ablated"]["n"]
    # the removals' contrasts on the questions whose ablated and sham graphs have equal sizes
    assert 0 < s["same_size_removals"]["n"] <= s["graph_sizes"]["n"] and "sham_vs_ablated" in s["same_size_removals"]
    runs = sorted((tmp_path / "root" / "runs" / "product").glob("fold-?-seed-?.json"))
    assert len(runs) == 6  # one per (fold, seed), each beside its recorded pieces
    assert not list((tmp_path / "root" / "runs" / "product").glob("*.lock"))  # every unit's lock released
    # train, the validation part's greedy answers, 5 conditions, own and none in the named-speaker form
    assert len(list((tmp_path / "root" / "runs" / "product").glob("fold-0-seed-0.*.json"))) == 9
    unit = json.loads(runs[0].read_text())
    assert unit["steps_run"] == unit["steps"] == 2 and [r["step"] for r in unit["train_curve"]] == [1, 2]
    assert [r["step"] for r in unit["val_history"]] == [1, 2] and 0 <= unit["val_f1"] <= 1
    assert unit["num_graph_tokens"] == 5 and len(unit["prompt_text_tokens"]) == len(unit["scores"]["qa_id"])
    assert set(unit["named"]["predictions"]) == {"own", "none"}  # today's default in the named-speaker form too
    assert s["text_units"] == s["graph_units"] == 10 and s["steps_run"] == {f"{f}-{x}": 2 for f in range(3) for x in (0, 1)}
    assert s["prompt_tokens"]["own"]["all"] == s["prompt_tokens"]["none"]["all"] + 5
    stamps = [p.stat().st_mtime_ns for p in runs]
    assert script.main(argv) == 0  # the rerun trains nothing: every unit is recorded
    assert " seed 0: train " not in capsys.readouterr().out
    assert [p.stat().st_mtime_ns for p in runs] == stamps
    # a part cut off inside a unit: its recorded pieces are reused, only the missing one runs again
    folder = tmp_path / "root" / "runs" / "product"
    (folder / "fold-0-seed-0.json").unlink()
    (folder / "fold-0-seed-0.own.json").unlink()
    weights = (folder / "fold-0-seed-0.weights.pt").stat().st_mtime_ns
    assert script.main(argv) == 0
    again = capsys.readouterr().out
    assert "[product fold 0 seed 0] own:" in again and "[product fold 0 seed 0] none:" not in again
    assert (folder / "fold-0-seed-0.weights.pt").stat().st_mtime_ns == weights  # not trained again
    assert (folder / "fold-0-seed-0.json").exists()
    # a unit recorded before its variant was scored in the named-speaker form: only those two pieces run
    older = json.loads((folder / "fold-1-seed-0.json").read_text())
    older.pop("named")
    (folder / "fold-1-seed-0.json").write_text(json.dumps(older) + "\n")
    for name in ("named-own", "named-none"):
        (folder / f"fold-1-seed-0.{name}.json").unlink()
    weights = (folder / "fold-1-seed-0.weights.pt").stat().st_mtime_ns
    assert script.main(argv) == 0
    again = capsys.readouterr().out
    assert "[product fold 1 seed 0] named-own:" in again and "[product fold 1 seed 0] named-none:" in again
    assert "[product fold 1 seed 0] own:" not in again and "[product fold 1 seed 1]" not in again
    assert (folder / "fold-1-seed-0.weights.pt").stat().st_mtime_ns == weights
    assert "named" in json.loads((folder / "fold-1-seed-0.json").read_text())
    # the graph sizes need the samples only
    sizes = tmp_path / "sizes.json"
    assert script.main(argv[:-2] + ["--graph-sizes", "--out", str(sizes)]) == 0
    g = json.loads(sizes.read_text())
    assert g["questions"] == result["scored_cases"] and g["all"]["n"] == g["with_sham_graph"] == s["own_vs_sham"]["n"]
    assert {"own", "ablated", "sham", "sham_minus_ablated"} <= set(g["all"]["nodes"])
    # a text-dropout variant trains through the data module's option: every training read is cut at p = 1
    td = argv[:argv.index("--seeds")] + ["--seeds", "0", "--variants", "td1.0-1", "--fold-list", "0", "--n-boot", "200",
                                         "--threads", "1", "--out", str(tmp_path / "td.json")]
    assert script.main(td) == 0
    meta = json.loads((tmp_path / "root" / "runs" / "td1.0-1" / "fold-0-seed-0.train.json").read_text())
    assert meta["text_dropout_share"] == 1.0
    assert json.loads((folder / "fold-0-seed-0.train.json").read_text())["text_dropout_share"] is None
    # the named validation rule against the product's same units: one of three units cannot decide it
    choice = json.loads((tmp_path / "td.json").read_text())["validation_choice"]
    row = choice["candidates"]["td1.0-1"]
    assert choice["units"] == 3 and choice["need_lower_in"] == 3 and row["units"] == 1
    assert row["status"] == ("open" if row["lower_in"] == 1 else "cannot win") and choice["chosen"] is None


def test_units_run_fold_major_so_every_variant_finishes_a_fold_before_the_next():
    script = load_bench_script("bench.studies.graph_token.crossfit")
    order = script.unit_order([1, 2], ["product", "m3-answer"], [0, 1])
    assert order[:4] == [(1, "product", 0), (1, "product", 1), (1, "m3-answer", 0), (1, "m3-answer", 1)]
    assert [f for f, _, _ in order] == [1, 1, 1, 1, 2, 2, 2, 2] and len(set(order)) == 8


def test_the_answer_mode_reads_the_chosen_defaults_figures_once_every_fold_is_in():
    script = load_bench_script("bench.studies.graph_token.crossfit")

    def s(folds, plain, named, shares=None):
        return {"folds_done": folds, "answers_own_vs_none": {"f1": {"diff": {"mean": plain}}},
                "answers_own_vs_none_named": {"f1": {"diff": {"mean": named}}},
                **({"degenerate_share": shares} if shares else {})}

    even = {"plain": {"token": 0.0, "none": 0.0}, "named": {"token": 0.01, "none": 0.02}}
    summaries = {"product": s([0, 1], 0.01, -0.02), "m3-answer": s([0, 1], 0.04, 0.01, even)}
    compact_won = script.choose_answer_mode({"chosen": "m3-answer", "compact_default": True}, summaries, folds=2)
    assert compact_won["default"] == "m3-answer" and compact_won["graph_mode"] == "token"
    unshared = {**summaries, "m3-answer": s([0, 1], 0.04, 0.01)}  # F1 alone cannot ship the tokens
    assert script.choose_answer_mode({"chosen": "m3-answer", "compact_default": True}, unshared,
                                     folds=2)["graph_mode"] is None
    kept = script.choose_answer_mode({"chosen": "m3-answer", "compact_default": False}, summaries, folds=2)
    assert kept["default"] == "product" and kept["graph_mode"] == "none"  # its named form loses F1
    assert kept["f1_own_minus_none"] == {"plain": 0.01, "named": -0.02}
    early = script.choose_answer_mode({"chosen": "m3-answer", "compact_default": True}, summaries, folds=3)
    assert early["graph_mode"] is None  # a fold missing from the summary: not decided


def test_a_unit_lock_is_held_by_a_live_process_and_taken_over_from_a_dead_one(tmp_path):
    import subprocess
    import sys

    claim = load_bench_script("bench.studies.graph_token.crossfit").claim
    lock = tmp_path / "fold-0-seed-0.lock"
    assert claim(lock) and lock.read_text() == str(__import__("os").getpid())
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        lock.write_text(str(other.pid))
        assert not claim(lock) and lock.read_text() == str(other.pid)  # a live holder keeps it
    finally:
        other.kill()
        other.wait()
    assert claim(lock) and lock.read_text() != str(other.pid)  # its holder died: taken over
    lock.write_text("not a pid")
    assert claim(lock)  # an unreadable lock is stale too
    lock.write_text("")
    assert not claim(lock) and lock.read_text() == ""  # just created by another copy, its pid not yet written
    old = __import__("time").time() - 120
    __import__("os").utime(lock, (old, old))
    assert claim(lock) and lock.read_text() == str(__import__("os").getpid())  # left empty long ago: stale


def test_a_process_estimates_its_first_pieces_from_the_recorded_units(tmp_path):
    import json

    recorded_seconds = load_bench_script("bench.studies.graph_token.crossfit").recorded_seconds
    runs = tmp_path / "runs"
    assert recorded_seconds(runs, "kv3-full") == {}  # nothing recorded: no estimate
    (runs / "kv3-answer").mkdir(parents=True)
    for seed, train_s in ((0, 2341.4), (1, 2309.0)):
        stem = runs / "kv3-answer" / f"fold-0-seed-{seed}"
        stem.with_name(stem.name + ".train.json").write_text(json.dumps({"train_s": train_s}))
        stem.with_name(stem.name + ".own.json").write_text(json.dumps({"score_s": 383.0 - seed}))
        stem.with_name(stem.name + ".sham.json").write_text(json.dumps({"score_s": 90.0 + seed}))
    (runs / "kv3-full").mkdir()
    (runs / "kv3-full" / "fold-0-seed-0.train.json").write_text(json.dumps({"train_s": 1800.0,
                                                                              "stage1": {"seconds": 525.0}}))
    (runs / "kv3-full" / "fold-0-seed-1.train.json").write_text("{not json")  # being written: skipped
    assert recorded_seconds(runs, "kv3-full") == {"train": 1800.0, "stage1": 525.0,  # its own units
                                                  "generate": 383.0, "score": 91.0}  # the rest: every variant's
    # a variant with none of its own: the longest of every variant's
    assert recorded_seconds(runs, "kv0-full") == {"train": 2341.4, "stage1": 525.0, "generate": 383.0,
                                                  "score": 91.0}
    # a process keeps one clock per variant: a fit it measured for one recipe does not stand for another's
    unit_clock = load_bench_script("bench.studies.graph_token.crossfit").unit_clock
    clocks = {}
    unit_clock(clocks, runs, "kv3-full", 100.0)["train"] = 600.0  # measured in this process
    assert unit_clock(clocks, runs, "kv3-full", 100.0)["train"] == 600.0
    assert unit_clock(clocks, runs, "kv0-full", 100.0) == {"deadline": 100.0, "train": 2341.4, "stage1": 525.0,
                                                           "generate": 383.0, "score": 91.0}


@pytest.mark.skipif(not _has_readout("summary_units"), reason="the summary_units readout is not in the model yet")
def test_a_compact_variant_stops_early_scores_both_forms_and_joins_text10(tmp_path, capsys):
    config = _config(tmp_path)
    script = load_bench_script("bench.studies.graph_token.crossfit")
    script.EARLY_STOP.update(val_check_interval=1, patience=1, max_steps=6)  # the study's 10, 2, 120, made tiny
    root, out = tmp_path / "root", tmp_path / "compact.json"
    argv = ["--config", str(config), "--root", str(root), "--folds", "3", "--fold-list", "0", "--seeds", "0",
            "--variants", "product", "m3-answer", "--n-boot", "200", "--threads", "1", "--out", str(out)]
    assert script.main(argv) == 0
    unit = json.loads((root / "runs" / "m3-answer" / "fold-0-seed-0.json").read_text())
    assert unit["text_units"] == 3 and unit["num_graph_tokens"] == 11 and 1 <= unit["steps_run"] <= 6
    assert unit["early_stop"] == {"val_check_interval": 1, "patience": 1, "max_steps": 6}
    assert [r["step"] for r in unit["val_history"]] == list(range(1, unit["steps_run"] + 1))  # a validation a step
    assert [r["step"] for r in unit["train_curve"]] == list(range(1, unit["steps_run"] + 1))
    named = unit["named"]  # the held-out questions again, in the named-speaker form
    assert named["qa_id"] == unit["scores"]["qa_id"] and set(named["predictions"]) == {"own", "none"}
    result = json.loads(out.read_text())
    s = result["summaries"]["m3-answer"]
    assert (s["text_units"], s["graph_units"]) == (3, 10) and "f1" in s["answers_own_vs_none_named"]
    assert s["prompt_tokens"]["own"]["graph"] == 11 and s["prompt_tokens"]["none"]["graph"] == 0
    assert result["summaries"]["product"]["text_units"] == 10
    assert result["variant_settings"]["m3-answer"]["model"]["readout"] == "summary_units"
    choice = result["compact_choice"]  # 1 of the 3 units: nothing chosen yet
    assert choice["candidates"]["m3-answer"]["units"] == 1 and choice["chosen"] is None and not choice["decided"]
    assert result["answer_mode"]["default"] is None and result["answer_mode"]["graph_mode"] is None
    # the text-10 reference joined by question id: one question without a row is counted and left out
    qa = unit["scores"]["qa_id"]
    text10 = tmp_path / "scores.jsonl"
    text10.write_text("".join(json.dumps({"qa_id": q, "units": {"10": {"nll": 1.0, "f1": 0.0, "em": 0.0, "judge": 0.0,
                                                                         "prompt_tokens": 120}}}) + "\n"
                              for q in qa[1:]))
    assert script.main(argv[:-2] + ["--summary-only", "--text10", str(text10), "--out", str(out)]) == 0
    s = json.loads(out.read_text())["summaries"]["m3-answer"]
    assert s["text10_missing"] == 1 and s["own_vs_text10"]["n"] == len(qa) - 1
    assert s["prompt_tokens"]["text10"]["all"] == 120
    # a graph budget the samples do not hold is refused, naming the setting
    assert script.main(argv[:-2] + ["--variants", "m3-full-k20"]) == 2
    assert "data.activation.k" in capsys.readouterr().err


def _staged_script(tmp_path, monkeypatch, stage1_steps: int):
    """The tiny config with the product's word stage off (a variant sets its own stages), and the cross-fit
    script with early stopping and stage 1 (reconstruction) sized for it."""
    config = tmp_path / "config.yaml"
    cfg = yaml.safe_load(_config(tmp_path).read_text())
    cfg["model"]["stages"] = []
    config.write_text(yaml.safe_dump(cfg))
    script = load_bench_script("bench.studies.graph_token.crossfit")
    script.EARLY_STOP.update(val_check_interval=1, patience=1, max_steps=2)
    monkeypatch.setitem(script.STAGE1["init_args"], "steps", stage1_steps)
    monkeypatch.setitem(script.STAGE1["init_args"], "batch_size", 2)
    return config, script


def test_the_full_recipes_stage_1_is_a_piece_of_its_own_recorded_and_reused(tmp_path, monkeypatch):
    """Stage 1 runs before the fit, its weights are recorded, the fit starts from them with the stage off,
    and a rerun reuses them instead of reconstructing again."""
    import torch

    import qgmem.training.reconstruction as reconstruction

    config, script = _staged_script(tmp_path, monkeypatch, stage1_steps=3)
    real, seen = reconstruction.reconstruct_memory, {}

    def spy(net, *a, **k):  # the weights before and after the real stage
        seen["before"] = {n: v.detach().clone() for n, v in net.state_dict().items()}
        out = real(net, *a, **k)
        seen["after"] = {n: v.detach().clone() for n, v in net.state_dict().items()}
        return out

    monkeypatch.setattr(reconstruction, "reconstruct_memory", spy)
    root = tmp_path / "root"
    argv = ["--config", str(config), "--root", str(root), "--folds", "3", "--fold-list", "0", "--seeds", "0",
            "--variants", "m3-full", "--n-boot", "100", "--threads", "1"]
    assert script.main(argv) == 0
    runs = root / "runs" / "m3-full"
    saved = torch.load(runs / "fold-0-seed-0.stage1.pt")
    assert saved["result"]["steps"] == 3 and set(saved["result"]) >= {"first_loss", "last_loss", "seconds"}
    unit = json.loads((runs / "fold-0-seed-0.json").read_text())
    assert unit["stage1"] == saved["result"] and unit["steps_run"] >= 1
    # the stage changed the weights, and what was recorded is what it left
    assert any(not torch.equal(v, seen["before"][k]) for k, v in seen["after"].items())
    assert all(torch.equal(v, seen["after"][k]) for k, v in saved["state"].items())
    # a rerun that lost everything after stage 1 reuses it: reconstructing again would fail here
    for f in runs.iterdir():
        if f.name != "fold-0-seed-0.stage1.pt":
            f.unlink()

    def refuse(*a, **k):
        raise AssertionError("stage 1 ran again")

    monkeypatch.setattr(reconstruction, "reconstruct_memory", refuse)
    assert script.main(argv) == 0
    assert json.loads((runs / "fold-0-seed-0.json").read_text())["stage1"] == saved["result"]


def test_a_deep_reader_unit_runs_with_its_stages_and_records_its_injection(tmp_path, monkeypatch):
    """``kv0-full`` end to end on the tiny setting: the graph alone as keys and values at every layer, stage 1
    (reconstruction) and distillation; its unit and summary say ``kv_prefix`` and the budgets."""
    config, script = _staged_script(tmp_path, monkeypatch, stage1_steps=2)
    root, out = tmp_path / "root", tmp_path / "kv.json"
    argv = ["--config", str(config), "--root", str(root), "--folds", "3", "--fold-list", "0", "--seeds", "0",
            "--variants", "kv0-full", "--n-boot", "100", "--threads", "1", "--out", str(out)]
    assert script.main(argv) == 0
    unit = json.loads((root / "runs" / "kv0-full" / "fold-0-seed-0.json").read_text())
    assert unit["injection"] == "kv_prefix" and unit["text_units"] == 0 and unit["num_graph_tokens"] == 11
    assert unit["stage1"]["steps"] == 2 and unit["steps_run"] >= 1
    assert set(unit["scores"]["nll"]) == set(script.CONDITIONS)
    result = json.loads(out.read_text())
    s = result["summaries"]["kv0-full"]
    assert (s["injection"], s["text_units"], s["graph_units"]) == ("kv_prefix", 0, 10)
    assert result["variant_settings"]["kv0-full"]["model"]["injection"] == "kv_prefix"


# bench/studies/graph_token/kv_init.py: a fresh prefix scored at its initialisation, own graph against none,
# on fold 0's validation part of the saved samples (a diagnostic of the deep reader)

def test_kv_init_scores_a_fresh_prefix_against_none_on_the_saved_samples(tmp_path, monkeypatch, capsys):
    config, crossfit = _staged_script(tmp_path, monkeypatch, stage1_steps=1)
    root = tmp_path / "root"
    kv_init = load_bench_script("bench.studies.graph_token.kv_init")
    argv = ["--config", str(config), "--root", str(root), "--folds", "3", "--variants", "kv0-full", "kv3-answer"]
    # the cross-fit's samples do not exist yet: one line naming their folder, exit 2
    assert kv_init.main(argv) == 2 and "--samples-only" in capsys.readouterr().err
    assert crossfit.main(["--config", str(config), "--root", str(root), "--folds", "3", "--samples-only",
                          "--threads", "1"]) == 0
    capsys.readouterr()
    assert kv_init.main(argv) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert set(out["variants"]) == {"kv0-full", "kv3-answer"} and out["val_questions"] > 0
    for r in out["variants"].values():
        assert r["own_minus_none"] == pytest.approx(r["own"] - r["none"], abs=1e-6)
        assert r["own"] != r["none"]  # the fresh prefix changes the answer's NLL
        assert 0.0 <= r["own_worse_share"] <= 1.0


def test_kv_init_reads_only_kv_variants(capsys):
    kv_init = load_bench_script("bench.studies.graph_token.kv_init")
    with pytest.raises(SystemExit) as exit_:
        kv_init.parse_args(["--variants", "m3-full"])
    assert exit_.value.code == 2 and "not a kv_prefix variant" in capsys.readouterr().err
