"""``bench/studies/graph_token/learning_check.py`` end to end on a tiny ConvoMem-form set and a random LM.

The figures of docs/BENCHMARKS.md come from this script, so its JSON line is checked here: the keys the
protocol promises, one entry per m of the budget sweep, per-seed figures for every seed, and the reuse
of a finished seed on a rerun. It trains 1 step per seed: nothing here says what the graph token adds.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from qgmem.model.random_lm import save_random_lm

from training.test_datamodule import write_convomem
from bench_script import load_bench_script

pytestmark = [pytest.mark.usefixtures("keep_torch_threads")]  # builds a small cache with the embedded sentence encoder




@pytest.fixture(scope="module")
def config(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("lc")
    lm = save_random_lm(root / "lm", hidden_size=32, layers=2)
    cfg = {"trainer": {"accelerator": "cpu", "precision": "32-true", "gradient_clip_val": 1.0},
           "model": {"lm": str(lm), "num_graph_tokens": 5,
                     "stages": [{"class_path": "qgmem.training.stages.NodeWordAlignment",
                                 "init_args": {"steps": 2, "batch_size": 4}}]},
           "data": {"data_path": str(write_convomem(root / "convomem")), "cache_dir": str(root / "cache"),
                    "distractor_conversations": 1, "split_ratios": [0.5, 0.25, 0.25], "batch_size": 2,
                    "max_prompt_tokens": 128, "max_answer_tokens": 8}}
    path = root / "config.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def last_json(out: str) -> dict:
    return json.loads(out.strip().splitlines()[-1])


def test_budget_sweep_prints_the_promised_json_line(config, tmp_path, capsys):
    script = load_bench_script("bench.studies.graph_token.learning_check")
    argv = ["--protocol", "budget", "--memory-units", "0", "1", "--config", str(config), "--root", str(tmp_path),
            "--seeds", "0", "1", "--steps", "1", "--split", "val", "--n-boot", "200", "--threads", "1"]
    assert script.main(argv) == 0
    first = capsys.readouterr().out
    result = last_json(first)
    assert sorted(result["budget"]) == ["0", "1"]
    assert result["seeds"] == 2 and result["seed_list"] == [0, 1] and result["split"] == "val"
    assert result["n_test"] > 0 and "budget_target_met" in result
    for m, entry in result["budget"].items():
        assert {"own_vs_ablated", "own_vs_none", "own_vs_shuffled", "own_vs_norel"} <= set(entry), m
        assert entry["ablation"]["ablated"] == entry["own_vs_ablated"]["n"] > 0  # every usable sample here
        assert len(entry["per_seed"]) == 2 and [s["seed"] for s in entry["per_seed"]] == [0, 1]
        assert entry["prompt_graph_tokens"] == 5 and "probe" in entry
        lo, hi = entry["own_vs_none"]["ci95"]
        assert lo <= entry["own_vs_none"]["mean"] <= hi
    assert result["budget"]["0"]["target_met"] is None  # the target is set at m = 1 and 3 only
    # no text at m = 0: the prompt is shorter than at m = 1
    assert result["budget"]["0"]["memory_tokens"] < result["budget"]["1"]["memory_tokens"]
    assert result["budget"]["0"]["entries_whole"] == 0

    # a rerun reuses every finished seed and prints the same figures
    assert script.main(argv) == 0
    again = capsys.readouterr().out
    assert again.count("reused") == 4 and "train NLL" not in again
    rerun = last_json(again)
    assert rerun["budget"]["1"]["own_vs_none"] == result["budget"]["1"]["own_vs_none"]
