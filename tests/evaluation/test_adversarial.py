"""The swapped-speaker probe: which questions it asks, and what it guards (the name must not steer
dense retrieval to the wrong speaker)."""

from __future__ import annotations

import json
from pathlib import Path

from qgmem.evaluation.adversarial import swapped_speaker_cases
from qgmem.data.records import QA, Case, Dialogue, Session, Turn

FIXTURE = Path(__file__).parents[1] / "activation" / "fixtures" / "locomo_form.json"


def _case(speakers: list[str], questions: list[str]) -> Case:
    turns = [Turn(id=f"t{i}", session_id="s1", speaker=name, role="user", text=f"turn {i}", index=i)
             for i, name in enumerate(speakers)]
    qas = [QA(id=f"q{i}", question=q, answer="a", category="single-hop", evidence_turn_ids=["t0"])
           for i, q in enumerate(questions)]
    return Case(id="c", dialogue=Dialogue(id="d", sessions=[Session(id="s1", turns=turns)]), qas=qas)


def test_each_question_naming_one_speaker_names_the_other():
    case = _case(["Priya", "Daniel", "Priya"], ["Where does Daniel volunteer?", "What is Priya's cat called?",
                                                "Who adopted Biscuit?", "Did Priya and Daniel meet?",
                                                "Is Danielle here?"])
    (out,), left_out = swapped_speaker_cases([case])
    assert [q.question for q in out.qas] == ["Where does Priya volunteer?", "What is Daniel's cat called?"]
    assert [q.id for q in out.qas] == ["q0/swapped", "q1/swapped"]
    assert all(q.evidence_turn_ids == ["t0"] and q.category == "single-hop" for q in out.qas)  # gold kept
    assert left_out == 3  # neither speaker, both, and "Danielle" (not a whole-word match)
    assert out.dialogue is case.dialogue and [q.question for q in case.qas][0] == "Where does Daniel volunteer?"


def test_a_dialogue_without_two_speakers_is_left_out_and_counted():
    out, left_out = swapped_speaker_cases([_case(["A", "B", "C"], ["Where did A go?", "Did B call?"])])
    assert out == [] and left_out == 2


def test_the_default_is_not_steered_by_the_wrong_name(capsys):
    """On the form fixture's swapped questions the default (names left out of the dense query) finds the
    evidence far more often than the names kept (the activation before round 10), and no less than BM25
    over raw turns; the control shows the probe can tell the two apart."""
    from qgmem.cli import main

    results = {}
    for mode in ("drop", "keep"):
        assert main(["eval-retrieval", "--dataset", "locomo", "--path", str(FIXTURE), "--swap-speakers",
                     "--dense-speaker-names", mode, "--no-dense-baseline", "--tokenizer", "none", "--json"]) == 0
        results[mode] = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    drop, keep = results["drop"], results["keep"]
    assert drop["n_questions"] == 28 and drop["swapped_speakers"] == {"questions": 28, "left_out": 3}
    assert keep["recall@10"] < 0.75  # control: the name steers the kept query (0.661 when measured)
    assert drop["recall@10"] >= keep["recall@10"] + 0.2  # 0.982 when measured
    assert drop["recall@10"] >= drop["baseline_bm25_turns"]["recall@10"]
