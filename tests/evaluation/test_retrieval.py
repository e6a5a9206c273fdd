from __future__ import annotations

import json
from pathlib import Path

import pytest

from qgmem.activation.config import ActivationConfig
from qgmem.evaluation.retrieval import evaluate_cases
from qgmem.data.records import QA, Case, Dialogue, Session, Turn

FIXTURE = Path(__file__).parents[1] / "activation" / "fixtures" / "locomo_form.json"


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


def _pool_case(small_store) -> Case:
    case = _case(small_store)
    # t11 (charity race) and t5 (adoption agencies) share words with the question; t3 (the painting) none
    case.qas = [QA(id="p1", question="Did Caroline run a charity race or research adoption agencies?", answer="-",
                   category="pool", evidence_turn_ids=["t11", "t5", "t3"])]
    return case


def test_pool_recall_per_channel_and_fused(small_store, hash_encoder):
    lexical_only = evaluate_cases([_pool_case(small_store)], lambda case: small_store, hash_encoder,
                                  ActivationConfig(k=1, pool_size=8, channels=("lexical",)))
    # BM25 finds the two units sharing words (u5, u2) and two more "Caroline" units; never the painting
    assert lexical_only["pool_recall"] == {"lexical": 2 / 3, "fused": 2 / 3}
    assert lexical_only["recall@1"] == 1 / 3 and lexical_only["recall@5"] == 2 / 3
    both = evaluate_cases([_pool_case(small_store)], lambda case: small_store, hash_encoder,
                          ActivationConfig(k=1, pool_size=8, channels=("lexical", "semantic")))
    # the semantic channel returns all 8 units of the store, so the fused pool holds every gold turn
    assert both["pool_recall"] == {"lexical": 2 / 3, "semantic": 1.0, "fused": 1.0}
    assert both["recall@30"] == 1.0 and both["pool_size"] == 8


def test_per_question_file(small_store, hash_encoder, tmp_path):
    out = tmp_path / "diag" / "questions.jsonl"
    summary = evaluate_cases([_case(small_store)], lambda case: small_store, hash_encoder, ActivationConfig(k=2),
                             out=out)
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["question_id"] for r in rows] == ["q1", "q2"]  # q3 has no gold evidence
    q1, q2 = rows
    assert q1["gold_turn_ids"] == ["t11"] and q1["ungrounded_gold_turn_ids"] == []
    assert q1["activated"][0]["unit_id"] == "u5" and q1["activated"][0]["source_turn_ids"] == ["t11"]
    assert q1["activated"][0]["speaker"] == "Caroline" and len(q1["activated"]) == 2
    assert q1["gold_rank"] == {"t11": 1} and q1["recall@5"] == 1.0
    assert q1["ndcg@2"] == 1.0 and q1["precision@2"] == 0.5  # the gold unit first, one of two slots
    units = {u.id: u.source_turn_ids for u in small_store.units}
    assert all(a["source_turn_ids"] == units[a["unit_id"]] for r in rows for a in r["activated"])
    # t99 is grounded by no unit: never ranked by activation, first for BM25 over the raw turns
    assert q2["ungrounded_gold_turn_ids"] == ["t99"] and q2["gold_rank"] == {"t99": None}
    assert q2["gold_rank_bm25_turns"] == {"t99": 1} and set(q2["gold_rank_dense_turns"]) == {"t99"}
    assert q2["pool_recall"]["fused"] == 0.0
    assert set(summary) >= {"baseline_bm25_turns", "baseline_dense_turns", "recall@20", "pool_recall"}
    assert summary["baseline_bm25_turns"]["recall@2"] == 1.0


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
    assert set(result["baseline_bm25_turns"]) >= {"recall@10", "ndcg@10", "precision@10", "recall@30"}
    assert set(result["baseline_dense_turns"]) >= {"recall@10", "ndcg@10", "recall@5"}
    assert set(result["pool_recall"]) >= {"lexical", "semantic", "attribute", "fused"}
    assert result["recall@5"] <= result["recall@10"] <= result["recall@20"] <= result["recall@30"]
    assert result["n_questions"] == n_questions and set(result["per_category"]) == categories
    assert 0.0 <= result["recall@10"] <= result["recall_ceiling"] <= 1.0
    assert result["context_tokens_mean"] > 0


def test_dense_baseline_encodes_the_question_as_written(small_store, hash_encoder, tmp_path):
    """With ``dense_speaker_names`` drop the activator's query leaves the name out; the dense turn baseline
    must still embed the question as written, or it would stop being the plain baseline."""
    from qgmem.activation.activator import Activator
    from qgmem.evaluation.baselines import DenseTurnBaseline

    case = _case(small_store)
    # a question naming a speaker; its gold turn ranks 3rd for the question as written, 8th without the name
    case.qas = [QA(id="n1", question="Where does Melanie plan to move?", answer="-", category="named",
                   evidence_turn_ids=["t13"])]
    ranks = {}
    for mode in ("keep", "drop"):
        out = tmp_path / f"{mode}.jsonl"
        evaluate_cases([case], lambda c: small_store, hash_encoder, ActivationConfig(k=2, dense_speaker_names=mode),
                       out=out)
        ranks[mode] = [json.loads(line)["gold_rank_dense_turns"] for line in out.read_text().splitlines()]
    assert ranks["drop"] == ranks["keep"] == [{"t13": 3}]
    # control: the name-free vector the activator searches with ranks the raw turns differently
    act = Activator(small_store, hash_encoder, ActivationConfig(dense_speaker_names="drop"))
    question = case.qas[0].question
    act.activate(question)
    assert act.last_question_vec is None
    dense = DenseTurnBaseline(case.dialogue, hash_encoder)
    assert dense.retrieve(question, 10, act.last_query_vec) != dense.retrieve(question, 10)


def test_cli_model_weight_reaches_the_settings(capsys):
    """``--model-weight`` is the setting's own check: out of [0, 1] it is a user's error, named."""
    from qgmem.cli import main

    assert main(["eval-retrieval", "--dataset", "locomo", "--path", str(FIXTURE), "--reranker", "trained",
                 "--reranker-path", "unused", "--model-weight", "1.5", "--tokenizer", "none"]) == 2
    assert "model_weight must lie in [0, 1], got 1.5" in capsys.readouterr().err


def test_settings_are_activation_s_defaults():
    """eval-retrieval's flags default to ``ActivationConfig``'s fields: the defaults evaluate the product's activation."""
    from qgmem.evaluation.retrieval import RetrievalEvalSettings

    assert RetrievalEvalSettings(dataset="locomo", path="p").activation() == ActivationConfig()
    # a k past the pool grows the pool with it
    assert RetrievalEvalSettings(dataset="locomo", path="p", k=120).activation().pool_size == 120
