"""``bench/studies/graph_token/headroom.py`` end to end on a tiny ConvoMem-form set and a random LM.

Checks that every usable question is scored once at every budget, that the budgets cut the prompt's
text (m = 0 holds none), that the JSON holds each ``m − max`` contrast with its pooled figure without
abstention and per category, that a rerun scores nothing again, that ``--summary-only`` rewrites the
same JSON and prints the tables, and that one budget's rows come back by ``qa_id``. Nothing here says
what a budget costs.
"""

from __future__ import annotations

import json

import pytest
import yaml

from qgmem.model.random_lm import save_random_lm

from training.test_datamodule import write_convomem
from bench_script import load_bench_script

pytestmark = [pytest.mark.usefixtures("keep_torch_threads")]  # replays a small data set


def test_headroom_scores_every_question_at_every_budget_once(tmp_path, capsys):
    lm = save_random_lm(tmp_path / "lm", hidden_size=32, layers=1)
    cfg = {"model": {"lm": str(lm), "generation": {"max_new_tokens": 4}},
           "data": {"data_path": str(write_convomem(tmp_path / "convomem", items_per_person=3)),
                    "cache_dir": str(tmp_path / "cache"), "distractor_conversations": 1, "max_answer_tokens": 8}}
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump(cfg))
    script = load_bench_script("bench.studies.graph_token.headroom")
    out = tmp_path / "headroom.json"
    argv = ["--config", str(config), "--root", str(tmp_path / "root"), "--folds", "3", "--units", "2", "0", "1",
            "--max-prompt-tokens", "512", "--n-boot", "200", "--threads", "1", "--out", str(out)]
    assert script.main(argv) == 0
    result = json.loads(out.read_text())
    assert result["complete"] and result["units"] == [0, 1, 2] and result["max_prompt_tokens"] == 512
    assert result["n"] == result["questions"] > 0
    lines = list((tmp_path / "root").glob("headroom-*/scores.jsonl"))[0].read_text().splitlines()
    assert len(lines) == result["n"] == len({json.loads(x)["qa_id"] for x in lines})
    budgets = result["budgets"]
    assert budgets["0"]["memory_tokens"]["all"] == 0
    assert budgets["0"]["prompt_tokens"]["all"] < budgets["1"]["prompt_tokens"]["all"] <= budgets["2"]["prompt_tokens"]["all"]
    assert all(b["prompts_trimmed"] == 0 for b in budgets.values())
    assert set(result["contrasts"]) == {"m0_vs_m2", "m1_vs_m2"}
    for metric in ("nll", "f1", "em", "judge"):
        r = result["contrasts"]["m1_vs_m2"][metric]
        assert r["n"] == result["n"] and r["design"] == "crossed" and r["seeds"] == 1
        assert r["ci95"][0] <= r["mean"] <= r["ci95"][1]
        assert "without_abstention" in r and set(r["per_category"]) == set(result["per_category_n"])
    assert not list((tmp_path / "root").glob("headroom-*/*.lock"))  # every window's lock released
    capsys.readouterr()
    assert script.main(argv) == 0  # the rerun scores nothing: every question is recorded
    assert "scoring the rest" not in capsys.readouterr().out
    assert len(list((tmp_path / "root").glob("headroom-*/scores.jsonl"))[0].read_text().splitlines()) == len(lines)

    # --summary-only: the same JSON and the markdown tables from the recorded scores, nothing scored
    again = tmp_path / "again.json"
    assert script.main([*argv[:-1], str(again), "--summary-only"]) == 0
    printed = capsys.readouterr().out
    assert "scoring the rest" not in printed and "| m | prompt tokens | answer NLL | F1 | EM | judge |" in printed
    assert "m1 − m2 (95 % CI" in printed
    summary_again = json.loads(again.read_text())
    assert {k: v for k, v in summary_again.items() if k != "wall_s"} == {k: v for k, v in result.items() if k != "wall_s"}

    # the largest budget's rows by qa_id: the text-only reference a matched-budget study pairs with
    reference = script.per_question(tmp_path / "root" / result["scores"], 2)
    assert set(reference) == {json.loads(x)["qa_id"] for x in lines}
    row = next(iter(reference.values()))
    assert {"group", "category", "nll", "f1", "em", "judge", "prompt_tokens"} <= set(row)
    assert sum(r["nll"] for r in reference.values()) / len(reference) == pytest.approx(budgets["2"]["nll"]["all"])
    with pytest.raises(KeyError, match="m=10 not scored"):
        script.per_question(tmp_path / "root" / result["scores"], 10)


def test_a_negative_budget_is_refused_naming_the_option(capsys):
    script = load_bench_script("bench.studies.graph_token.headroom")
    with pytest.raises(SystemExit) as stop:
        script.parse_args(["--units", "3", "-1"])
    assert stop.value.code == 2 and "--units must be >= 0" in capsys.readouterr().err
