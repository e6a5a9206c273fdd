"""eval-qa: question selection, rubric handling, the per-category table with one row per graph mode, and
the ``qgmem answer`` / ``qgmem eval-qa`` commands end to end on the ConvoMem sample."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from qgmem.cli import main
from qgmem.data.records import QA, Case, Dialogue
from qgmem.errors import UserError
from qgmem.llm.judge import LLMJudge, MatchJudge
from qgmem.evaluation.eval_qa import (answer_mode_figures, format_table, nll_contrasts, parse_modes, score_with_judge,
                                     select_questions, summarize)

from serving.helpers import make_export


def _case(i: int, categories: list[str]) -> Case:
    return Case(id=f"c{i}", dialogue=Dialogue(id=f"d{i}"),
                qas=[QA(id=f"c{i}q{j}", question="q", answer="a", category=c) for j, c in enumerate(categories)])


def test_limited_selection_covers_every_category():
    cases = [_case(0, ["user", "user", "user"]), _case(1, ["pref", "user"]), _case(2, ["change"])]
    picked = select_questions(cases, 3)
    assert [(c.id, [q.id for q in qs]) for c, qs in picked] == [("c0", ["c0q0"]), ("c1", ["c1q0"]), ("c2", ["c2q0"])]
    assert sum(len(qs) for _, qs in select_questions(cases, 0)) == 6


def test_parse_modes():
    assert parse_modes("token, none,token") == ["token", "none"]
    assert parse_modes("token,none,shuffled,ablated") == ["token", "none", "shuffled", "ablated"]
    with pytest.raises(UserError, match="unknown mode"):
        parse_modes("token,random")


def _row(category, mode, prediction, reference, rubric=False):
    return {"question": "q", "reference": reference, "prediction": prediction, "category": category,
            "graph_mode": mode, "rubric": rubric, "abstention": None, "correct": None,
            "em": None if rubric else float(prediction == reference), "f1": None if rubric else 0.5,
            "tokens": {"retrieved_context": 10, "total": 30}, "seconds": {"generation": 1.0, "total": 2.0},
            "error": None}


def test_rubric_rows_are_not_scored_without_an_llm_judge():
    rows = [_row("user_evidence", "token", "Green", "Green"), _row("preference_evidence", "token", "Try X", "A good "
                                                                  "response should ...", rubric=True)]
    score_with_judge(rows, MatchJudge(), "convomem")
    assert rows[0]["correct"] is True and rows[1]["correct"] is None
    table = {(r["category"], r["graph_mode"]): r for r in summarize(rows, ["token"])}
    assert table[("preference_evidence", "token")]["not_scored"] == 1
    assert table[("preference_evidence", "token")]["em"] is None and table[("all", "token")]["judged"] == 1
    llm_rows = [dict(r, correct=None) for r in rows]
    score_with_judge(llm_rows, LLMJudge(lambda batch: ["VERDICT: CORRECT"] * len(batch)), "convomem")
    assert [r["correct"] for r in llm_rows] == [True, True]


def test_table_has_one_row_per_category_and_mode():
    rows = [_row(c, m, "x", "x") for c in ("a", "b") for m in ("token", "none", "shuffled")]
    score_with_judge(rows, MatchJudge(), "convomem")
    table = summarize(rows, ["token", "none", "shuffled"])
    assert [(r["category"], r["graph_mode"]) for r in table] == [(c, m) for c in ("a", "b", "all")
                                                            for m in ("token", "none", "shuffled")]
    assert table[-1]["questions"] == 2 and table[-1]["accuracy"] == 1.0 and table[-1]["online_tokens"] == 30


def test_nll_contrasts_are_paired_per_question_with_intervals():
    rows = []
    for i in range(12):
        own = 2.0 + 0.1 * (i % 3)
        for mode, nll in (("token", own), ("none", own + 0.5), ("shuffled", own + 0.5 - 0.1 * (i % 2) * 10),
                          ("ablated", own + 0.25 if i < 8 else None)):
            rows.append({"qa_id": f"q{i}", "case_id": f"c{i % 6}", "graph_mode": mode, "nll": nll})
    out = nll_contrasts(rows, ["token", "none", "shuffled", "ablated"], n_boot=2000)
    assert set(out) == {"own_vs_none", "own_vs_ablated", "own_vs_shuffled"}
    assert out["own_vs_none"]["mean"] == pytest.approx(-0.5) and out["own_vs_none"]["ci95"] == pytest.approx([-0.5, -0.5])
    assert out["own_vs_ablated"]["n"] == 8 and out["own_vs_ablated"]["mean"] == pytest.approx(-0.25)
    lo, hi = out["own_vs_shuffled"]["ci95"]  # cases of -0.5 and of +0.5: an interval on 0
    assert out["own_vs_shuffled"]["mean"] == pytest.approx(0.0, abs=1e-12) and lo < 0 < hi
    assert nll_contrasts(rows, ["none", "shuffled"]) == {}  # no own mode, nothing to pair


def test_table_carries_answer_nll_and_the_overall_contrasts():
    rows = [dict(_row("a", m, "x", "x"), qa_id=f"q{i}", case_id=f"c{i}", nll=1.0 + (m == "none") + 0.01 * i)
            for i in range(4) for m in ("token", "none")]
    score_with_judge(rows, MatchJudge(), "convomem")
    table = summarize(rows, ["token", "none"])
    contrasts = nll_contrasts(rows, ["token", "none"], n_boot=500)
    for row in table:
        if row["category"] == "all":
            row["nll"] = contrasts
    by = {(r["category"], r["graph_mode"]): r for r in table}
    assert by[("all", "token")]["answer_nll"] == pytest.approx(1.015) and by[("a", "none")]["answer_nll"] == pytest.approx(2.015)
    printed = format_table(table, "rule")
    assert "| answer NLL |" in printed and "own vs none (n=4): -1.000 [-1.000, -1.000]" in printed


#: raw replies in the shapes the issue quotes, and an answer: (reply, its shape)
REPLIES = [("The answer is:", "lead_in"), ("[M5] Books have such an awesome power. (Caroline; turn 98; said 20", "entry"),
           ("", "empty"), ("Pottery.", None)]


def test_degenerate_replies_are_counted_per_mode_and_category_before_the_repair():
    from qgmem.prompting import final_answer, reply_shape

    rows = []
    for i, (reply, shape) in enumerate(REPLIES):
        assert reply_shape(reply) == shape
        for mode, text in (("token", reply), ("none", "Pottery.")):
            row = _row("a" if i < 2 else "b", mode, final_answer(text), "pottery")
            rows.append(dict(row, reply_shape=reply_shape(text)))
    rows.append(dict(_row("b", "token", "", "pottery"), reply_shape="empty", error="HTTP 500"))  # a failed request
    table = {(r["category"], r["graph_mode"]): r for r in summarize(rows, ["token", "none"])}
    assert table[("all", "token")]["degenerate"] == {"empty": 1, "lead_in": 1, "entry": 1, "all": 3, "share": 3 / 5}
    assert table[("a", "token")]["degenerate"]["all"] == 2 and table[("all", "none")]["degenerate"]["share"] == 0.0
    printed = format_table(list(table.values()), "rule")
    assert "| degenerate: empty / lead-in / entry (share) |" in printed and "| 1 / 1 / 1 (0.60) |" in printed
    figures = answer_mode_figures({"table": list(table.values())})
    assert figures["degenerate_share"] == {"token": 3 / 5, "none": 0.0}
    assert figures["f1_own_minus_none"] == pytest.approx(0.0)
    with pytest.raises(UserError, match="--graph-modes token,none"):
        answer_mode_figures({"table": [r for r in table.values() if r["graph_mode"] == "token"]})


@pytest.mark.slow
def test_answer_and_eval_qa_commands(tiny_lm_path, tmp_path, convomem_path, capsys):
    """Both commands on the real ConvoMem sample with a tiny export (MiniLM features, random LM)."""
    export = make_export(tmp_path / "export", tiny_lm_path, feature_dim=384,
                         data_split={"dataset": "convomem", "num_cases": None, "split_ratios": [0.5, 0.25, 0.25],
                                     "group_key": "dialogue", "seed": 0, "distractor_conversations": 0})
    history = next((convomem_path / "core_benchmark" / "evidence_questions" / "user_evidence").rglob("*.json"))
    assert main(["answer", "--export", str(export), "--history", str(history), "--question", "Which color?",
                 "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["answers"][0]["graph_mode"] == "token" and out["answers"][0]["memory"]
    # the store's size (memory_units is the prompt's text budget, a name the output leaves to the prompt)
    assert out["store_units"] >= len(out["answers"][0]["memory"]) > 0 and "memory_units" not in out
    assert main(["eval-qa", "--export", str(export), "--dataset", "convomem", "--path", str(convomem_path),
                 "--limit", "2", "--out", str(tmp_path / "eval")]) == 0
    printed = capsys.readouterr().out
    for mode in ("token", "none", "shuffled"):
        assert f"| all | {mode} | 2 |" in printed
    predictions = [json.loads(line) for line in (tmp_path / "eval" / "predictions.jsonl").read_text().splitlines()]
    assert len(predictions) == 6 and {p["graph_mode"] for p in predictions} == {"token", "none", "shuffled"}
    results = json.loads((tmp_path / "eval" / "results.json").read_text())
    assert results["cases"].startswith("the test split of the training run")
    assert results["budgets"] == {"text_units": None, "graph_units": 10}  # the export's, as it records them
    assert "the export's budgets: all units of text, 10 in the graph" in printed
    overall = [r for r in results["table"] if r["category"] == "all"]
    assert set(overall[0]["nll"]) == {"own_vs_none", "own_vs_shuffled"}
    assert all(r["answer_nll"] is not None for r in overall)
    for mode in ("token", "none", "shuffled"):  # the counts are the predictions' raw reply shapes
        shapes = [p["reply_shape"] for p in predictions if p["graph_mode"] == mode]
        assert results["degenerate"][mode]["all"] == sum(s is not None for s in shapes)
    assert "| degenerate: empty / lead-in / entry (share) |" in printed
    # the ablated mode: the graph without the evidence units, the prompt text the question's own
    assert main(["eval-qa", "--export", str(export), "--dataset", "convomem", "--path", str(convomem_path),
                 "--limit", "3", "--graph-modes", "token,ablated", "--json", "--out", str(tmp_path / "eval2")]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["ablation"]["ablated"] + sum(v for k, v in out["ablation"].items() if k != "ablated") == 3
    assert out["ablation"]["ablated"] >= 1 and out["nll"]["own_vs_ablated"]["n"] >= 1
    rows = [json.loads(line) for line in (tmp_path / "eval2" / "predictions.jsonl").read_text().splitlines()]
    assert sum(r["graph_mode"] == "ablated" for r in rows) == out["ablation"]["ablated"]
    assert main(["answer", "--export", str(export), "--history", str(tmp_path / "missing.json"),
                 "--question", "Q?"]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_eval_qa_bad_speaker_names_exit_2_before_the_export_loads(tmp_path, convomem_path, capsys):
    """A bad ``--name-speakers`` is reported naming the flag, before the (missing) export is read."""
    assert main(["eval-qa", "--export", str(tmp_path / "no-export"), "--dataset", "convomem", "--path",
                 str(convomem_path), "--name-speakers", "Ingrid,ingrid"]) == 2
    err = capsys.readouterr().err
    assert err.splitlines()[0].endswith("--name-speakers: speaker names must be two different capitalized words, "
                                        "as USER,ASSISTANT (got 'Ingrid,ingrid')")
    assert "Traceback" not in err


@pytest.mark.slow
def test_eval_qa_named_speaker_form(tiny_lm_path, tmp_path, convomem_path, capsys):
    """``--name-speakers`` asks the same questions of the same cases in the third person, speakers named."""
    from qgmem.evaluation.named_form import third_person_question

    export = make_export(tmp_path / "export", tiny_lm_path, feature_dim=384,
                         data_split={"dataset": "convomem", "num_cases": None, "split_ratios": [0.5, 0.25, 0.25],
                                     "group_key": "dialogue", "seed": 0, "distractor_conversations": 0})
    runs = {}
    for name, extra in (("plain", []), ("named", ["--name-speakers", "Ingrid,Tobias"])):
        assert main(["eval-qa", "--export", str(export), "--dataset", "convomem", "--path", str(convomem_path),
                     "--limit", "3", "--graph-modes", "none", "--out", str(tmp_path / name), *extra]) == 0
        runs[name] = [json.loads(line) for line in (tmp_path / name / "predictions.jsonl").read_text().splitlines()]
    assert "in the named form (Ingrid, Tobias)" in capsys.readouterr().out
    assert [r["qa_id"] for r in runs["named"]] == [r["qa_id"] for r in runs["plain"]] and len(runs["plain"]) == 3
    assert [r["question"] for r in runs["named"]] == [third_person_question(r["question"], "Ingrid", "Tobias")
                                                      for r in runs["plain"]]
    assert any(r["question"] != p["question"] for r, p in zip(runs["named"], runs["plain"]))
    assert json.loads((tmp_path / "named" / "results.json").read_text())["named_speakers"] == ["Ingrid", "Tobias"]
    assert json.loads((tmp_path / "plain" / "results.json").read_text())["named_speakers"] is None
    for name in ("plain", "named"):
        assert set(json.loads((tmp_path / name / "results.json").read_text())["degenerate"]) == {"none"}


def test_eval_qa_finds_the_training_runs_split(convomem_path):
    """``--split test`` picks exactly the cases the sample build planned as test for the recorded settings."""
    from qgmem.data.loaders import load_cases
    from qgmem.evaluation.eval_qa import training_split_cases
    from qgmem.samples.build import plan_cases
    from qgmem.samples.spec import CacheSpec

    recorded = {"dataset": "convomem", "num_cases": 12, "split_ratios": [0.5, 0.25, 0.25], "group_key": "dialogue",
                "seed": 3, "distractor_conversations": 0}
    spec = CacheSpec(data_path=str(convomem_path), num_cases=12, split_ratios=(0.5, 0.25, 0.25),
                     group_key="dialogue", seed=3, distractor_conversations=0, data_fingerprint="stat")
    plan, _ = plan_cases(spec)
    cases = list(load_cases("convomem", convomem_path, distractor_conversations=0, seed=3).cases)
    for split in ("train", "val", "test"):
        chosen, note = training_split_cases(cases, split, recorded, "convomem")
        assert [c.id for c in chosen] == [c.id for name, c in plan if name == split] and chosen, split
    assert training_split_cases(cases, "all", recorded, "convomem")[0] == cases
    other = training_split_cases(cases, "test", {**recorded, "seed": 4}, "convomem")[0]
    assert [c.id for c in other] != [c.id for name, c in plan if name == "test"]  # the recorded seed is used
