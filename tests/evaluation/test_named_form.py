"""ConvoMem in the LoCoMo form: the speakers are renamed, the questions put in the third person, and the
gold evidence is left where it was."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from qgmem.evaluation.adversarial import swapped_speaker_cases
from qgmem.evaluation.named_form import check_names, named_speaker_cases, named_speaker_item, third_person_question
from qgmem.data.records import QA, Case, Dialogue, Session, Turn

REPO = Path(__file__).resolve().parents[2]
FIXTURE = Path(__file__).parents[1] / "activation" / "fixtures" / "locomo_form.json"


@pytest.mark.parametrize(("question", "expected"), [
    ("What is the speed of my internet plan?", "What is the speed of Ingrid's internet plan?"),
    ("Which landmark did I mention I was most excited to see?",
     "Which landmark did Ingrid mention Ingrid was most excited to see?"),
    ("I'm blanking on the name. Can you remind me what it was called?",
     "Ingrid is blanking on the name. Can Tobias remind Ingrid what it was called?"),
    ("What tip did you give me, and am I using it?", "What tip did Tobias give Ingrid, and is Ingrid using it?"),
    ("Your suggestion: do you still think I've got time?", "Tobias's suggestion: does Tobias still think Ingrid has got time?"),
    ("Was that idea mine or yours?", "Was that idea Ingrid's or Tobias's?"),
    ("Do you know? My plan is set.", "Does Tobias know? Ingrid's plan is set."),  # a sentence's first word
    ("What are some good fences for a townhouse?", "What are some good fences for a townhouse?"),  # names nobody
    ("Is the Mine Safety Act in Illinois?", "Is the Mine Safety Act in Illinois?"),  # capital I inside words
])
def test_third_person_question(question, expected):
    assert third_person_question(question, "Ingrid", "Tobias") == expected


def _case(speakers=("User", "Assistant", "User")) -> Case:
    turns = [Turn(id=f"t{i}", session_id="s1", speaker=name, role=name.lower(), text=f"turn {i}", index=i)
             for i, name in enumerate(speakers)]
    qas = [QA(id="q0", question="What did you suggest for my trip?", answer="Kyoto", category="assistant_facts",
              evidence_turn_ids=["t1"]),
           QA(id="q1", question="Which fence is best?", answer="cedar", category="preference",
              evidence_turn_ids=["t0", "t2"])]
    return Case(id="c7", dialogue=Dialogue(id="d", sessions=[Session(id="s1", turns=turns)]), qas=qas,
                source={"dataset": "convomem"})


def test_cases_are_renamed_and_the_gold_turns_kept():
    case = _case()
    (out,) = named_speaker_cases([case], ("Ingrid", "Tobias"))
    assert [(t.id, t.speaker, t.role, t.text) for t in out.dialogue.turns()] == [
        ("t0", "Ingrid", "user", "turn 0"), ("t1", "Tobias", "assistant", "turn 1"), ("t2", "Ingrid", "user", "turn 2")]
    assert [q.question for q in out.qas] == ["What did Tobias suggest for Ingrid's trip?", "Which fence is best?"]
    assert [(q.id, q.category, q.evidence_turn_ids, q.answer) for q in out.qas] == [
        ("q0", "assistant_facts", ["t1"], "Kyoto"), ("q1", "preference", ["t0", "t2"], "cedar")]
    assert out.source == {"dataset": "convomem", "speaker_names": ["Ingrid", "Tobias"]}
    assert out.dialogue.meta == {"speaker_a": "Ingrid", "speaker_b": "Tobias"}
    # the input is left as it was
    assert [t.speaker for t in case.dialogue.turns()] == ["User", "Assistant", "User"]
    assert case.qas[0].question == "What did you suggest for my trip?"


def test_the_swapped_probe_reads_the_named_form():
    """Named, a question about one speaker is one the swapped-speaker probe can ask of the other;
    a question naming nobody is left out (positive and negative case of the same probe)."""
    case = _case()
    case.qas[0].question = "What did you suggest for the trip?"
    (swapped,), left_out = swapped_speaker_cases(named_speaker_cases([case], ("Ingrid", "Tobias")))
    assert [q.question for q in swapped.qas] == ["What did Ingrid suggest for the trip?"] and left_out == 1


def test_other_speakers_are_refused_by_case():
    with pytest.raises(ValueError, match=r"case 'c7': speakers \['Daniel', 'User'\] are not ConvoMem's"):
        named_speaker_cases([_case(("User", "Daniel"))])


@pytest.mark.parametrize("names", [("Ingrid",), ("Ingrid", "Ingrid"), ("ingrid", "Tobias"), ("Ingrid", "Tobias Lee"),
                                   ("Ingrid", "Tobias", "Omar")])
def test_names_are_checked(names):
    with pytest.raises(ValueError, match="two different capitalized words"):
        check_names(names)


def test_the_flag_value_is_checked_and_applied_by_one_function():
    """eval-retrieval and eval-qa read ``--name-speakers`` through these; errors name the flag."""
    from qgmem.errors import UserError
    from qgmem.evaluation.named_form import cases_from_flag, names_from_flag

    assert names_from_flag("Ingrid, Tobias") == ("Ingrid", "Tobias")
    with pytest.raises(UserError, match="^--name-speakers: speaker names must be two different capitalized words"):
        names_from_flag("Ingrid")
    (out,), names = cases_from_flag([_case()], "Ingrid,Tobias")
    assert names == ["Ingrid", "Tobias"] and out.qas[0].question == "What did Tobias suggest for Ingrid's trip?"
    with pytest.raises(UserError, match=r"^--name-speakers: case 'c7': speakers \['Daniel', 'User'\]"):
        cases_from_flag([_case(("User", "Daniel"))], "Ingrid,Tobias")


def test_cli_bad_names_are_a_users_error(capsys):
    from qgmem.cli import main

    assert main(["eval-retrieval", "--dataset", "locomo", "--path", str(FIXTURE), "--name-speakers", "Ingrid",
                 "--tokenizer", "none"]) == 2
    err = capsys.readouterr().err
    assert "--name-speakers: speaker names must be two different capitalized words" in err.splitlines()[0]
    assert "Traceback" not in err
    # LoCoMo's speakers already have names: the rewrite does not apply, and says which case
    assert main(["eval-retrieval", "--dataset", "locomo", "--path", str(FIXTURE), "--name-speakers", "Ingrid,Tobias",
                 "--tokenizer", "none"]) == 2
    err = capsys.readouterr().err
    assert "case 'act-fixture-1'" in err.splitlines()[0] and "are not ConvoMem's User and Assistant" in err
    assert "Traceback" not in err


def test_cli_named_convomem(capsys, tmp_path):
    from qgmem.cli import main

    out = tmp_path / "q.jsonl"
    path = REPO / "data" / "convomem" / "core_benchmark" / "evidence_questions" / "user_evidence"
    assert main(["eval-retrieval", "--dataset", "convomem", "--path", str(path), "--limit", "1", "--name-speakers",
                 "Ingrid,Tobias", "--no-dense-baseline", "--tokenizer", "none", "--out", str(out), "--json"]) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert result["named_speakers"] == ["Ingrid", "Tobias"] and result["n_questions"] == 1
    (record,) = [json.loads(line) for line in out.read_text().splitlines()]
    assert {a["speaker"] for a in record["activated"]} <= {"Ingrid", "Tobias"}
    assert record["activated"] and record["gold_turn_ids"]


def test_verb_rules_agree_as_construction_does():
    """Each verb rule's verb ("am I" -> "is", "you've" -> "has") is what construction's agreement gives."""
    from qgmem.evaluation.named_form import _APOSTROPHE, FIRST_PERSON, SECOND_PERSON
    from qgmem.memory.extract_heuristic import third_person_verb

    checked = 0
    for pattern, replacement in FIRST_PERSON + SECOND_PERSON:
        text = pattern.replace("\\b", "").replace(_APOSTROPHE, "'")
        if "(" in text or text in ("I", "you"):  # a pronoun rule, no verb
            continue
        verb = next(w for w in text.replace("'", " '").split() if w not in ("I", "you"))
        agreed = next(w for w in replacement.split() if w != "{name}")
        assert third_person_verb(verb) == agreed, (pattern, replacement)
        checked += 1
    assert checked == 21  # every verb rule was read (a rule the reading skipped would fail here)


def test_a_stored_sample_takes_the_named_form_in_its_text_and_question_only():
    item = {"memory_text": "[M1] User started in Hanoi. (User; turn 11)\n[M2] Assistant mentions: Users love it. "
                           "(Assistant; turn 8)",
            "question": "Where did I start, and what did you say?", "node_text": ["User", "Hanoi"],
            "graph": object(), "qa_id": "q1"}
    named = named_speaker_item(item)
    assert named["memory_text"] == ("[M1] Ingrid started in Hanoi. (Ingrid; turn 11)\n[M2] Tobias mentions: Users "
                                    "love it. (Tobias; turn 8)")  # whole words only
    assert named["question"] == "Where did Ingrid start, and what did Tobias say?"
    assert named["node_text"] == ["Ingrid", "Hanoi"] and named["graph"] is item["graph"] and named["qa_id"] == "q1"
    assert item["memory_text"].startswith("[M1] User")  # the stored sample is left as it was
    assert "node_text" not in named_speaker_item({k: v for k, v in item.items() if k != "node_text"})
    with pytest.raises(ValueError, match="speaker names"):
        named_speaker_item(item, ("Ingrid", "Ingrid"))
