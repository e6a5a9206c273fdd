from __future__ import annotations

import json
from pathlib import Path

import pytest

from qgmem.activation.config import ActivationConfig
from qgmem.activation.evaluate import evaluate_cases, select_cases
from qgmem.data.records import QA, Case, Dialogue, Session, Turn

FIXTURE = Path(__file__).parent / "fixtures" / "locomo_form.json"


def _case(small_store) -> Case:
    texts = {u.source_turn_ids[0]: u.source_text for u in small_store.units}
    texts["t99"] = "I keep my spare keys under the blue flowerpot."
    turns = [Turn(id=tid, session_id="s1", speaker="Caroline", role="user", text=text, index=i)
             for i, (tid, text) in enumerate(texts.items())]
    qas = [
        QA(id="q1", question="Where did Caroline run a charity race?", answer="Boston", category="single",
           evidence_turn_ids=["t11"]),
        QA(id="q2", question="Where are the spare keys?", answer="Under the flowerpot", category="other",
           evidence_turn_ids=["t99"]),  # no unit grounds t99
        QA(id="q3", question="Anything else?", answer="-", category="other"),  # no gold evidence: skipped
    ]
    return Case(id="c1", dialogue=Dialogue(id="d1", sessions=[Session(id="s1", turns=turns)]), qas=qas)


def test_known_answers_beside_baseline(small_store, hash_encoder, smollm2_tokenizer):
    summary = evaluate_cases([_case(small_store)], lambda case: small_store, hash_encoder, ActivationConfig(k=1),
                             tokenizer=smollm2_tokenizer)
    assert summary["n_questions"] == 2 and summary["questions_without_evidence"] == 1
    assert summary["recall@1"] == 0.5 and summary["precision@1"] == 0.5 and summary["ndcg@1"] == 0.5
    assert summary["recall_ceiling"] == 0.5
    assert summary["baseline_bm25_turns"]["recall@1"] == 1.0  # raw turns include the ungrounded one
    assert summary["per_category"]["single"]["recall@1"] == 1.0
    assert summary["per_category"]["other"]["recall@1"] == 0.0
    assert summary["context_tokens_mean"] > 0 and summary["latency_ms_p95"] >= summary["latency_ms_p50"] > 0
    assert summary["n_cases"] == 1 and summary["units_total"] == len(small_store)


def test_select_cases_per_category(small_store):
    cases = []
    for i, category in enumerate(["a", "a", "b", "a", "b", "c"]):
        case = _case(small_store)
        case.id, case.qas = f"c{i}", [QA(id=f"q{i}", question="?", answer="", category=category)]
        cases.append(case)
    assert [c.id for c in select_cases(cases, per_category=1)] == ["c0", "c2", "c5"]
    assert [c.id for c in select_cases(cases, limit=2, per_category=2)] == ["c0", "c1"]
    assert len(select_cases(cases)) == 6


REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow
@pytest.mark.parametrize(
    ("dataset", "path", "extra", "n_questions", "categories"),
    [
        ("locomo", FIXTURE, [], 31, {"adversarial", "multi-hop", "open-domain", "single-hop", "temporal"}),
        # the smallest real category folder keeps the load short
        ("convomem", REPO / "data" / "convomem" / "core_benchmark" / "evidence_questions" / "implicit_connection_evidence",
         ["--limit", "2"], 2, {"implicit_connection_evidence"}),
    ],
)
def test_cli_json_last_line(capsys, dataset, path, extra, n_questions, categories):
    from qgmem.cli import main

    assert main(["eval-retrieval", "--dataset", dataset, "--path", str(path), "--k", "10", "--json", *extra]) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    for key in ("recall@10", "ndcg@10", "precision@10", "context_tokens_mean", "latency_ms_p50", "latency_ms_p95",
                "n_questions", "baseline_bm25_turns"):
        assert key in result
    assert set(result["baseline_bm25_turns"]) >= {"recall@10", "ndcg@10", "precision@10"}
    assert result["n_questions"] == n_questions and set(result["per_category"]) == categories
    assert 0.0 <= result["recall@10"] <= result["recall_ceiling"] <= 1.0
    assert result["context_tokens_mean"] > 0
