"""LoCoMo loader on the small fixture in the locomo10.json form."""

from __future__ import annotations

import json

import pytest

from qgmem.data.loaders import load_cases
from qgmem.data.locomo import ABSTAIN_ANSWER


@pytest.fixture
def loaded(locomo_file):
    return load_cases("locomo", locomo_file)


def test_cases_sessions_and_turns(loaded, locomo_file):
    raw = json.loads(locomo_file.read_text(encoding="utf-8"))
    assert [c.id for c in loaded.cases] == [s["sample_id"] for s in raw]
    case = loaded.cases[0]
    assert [s.id for s in case.dialogue.sessions] == ["S1", "S2"]
    assert [t.id for t in case.dialogue.turns()] == ["D1:1", "D1:2", "D1:3", "D1:4", "D1:5", "D2:1", "D2:2", "D2:3"]
    assert [t.index for t in case.dialogue.turns()] == list(range(8))
    assert case.dialogue.sessions[0].time == "2023-05-08T13:56:00"
    assert {t.time for t in case.dialogue.sessions[1].turns} == {"2023-05-25T13:14:00"}
    assert [t.role for t in case.dialogue.sessions[0].turns[:2]] == ["speaker_a", "speaker_b"]
    assert case.dialogue.sessions[0].turns[1].speaker == "Melanie"
    assert case.source["person_id"] == "conv-fx1" and case.source["item"] == 0


def test_caption_is_part_of_the_turn_and_text_round_trips(loaded, locomo_file):
    raw = json.loads(locomo_file.read_text(encoding="utf-8"))[0]["conversation"]
    turns = loaded.cases[0].dialogue.turn_map()
    assert turns["D1:4"].text == ("Look what I painted last week! "
                                  "[shares an image: a photo of a painting of a sunrise over a lake]")
    assert turns["D2:3"].text == "[shares an image: a photo of three kids at a café]"
    assert turns["D2:1"].text == raw["session_2"][0]["text"]  # "—" and "☔" unchanged
    assert turns["D2:2"].text == raw["session_2"][1]["text"]


def test_qas_categories_answers_and_evidence(loaded):
    qas = loaded.cases[0].qas
    assert [q.category for q in qas] == ["single-hop", "temporal", "multi-hop", "open-domain", "adversarial",
                                         "single-hop"]
    assert [q.meta["category_id"] for q in qas] == [4, 2, 1, 3, 5, 4]
    assert qas[3].answer == "3"  # an integer answer becomes a string
    assert qas[4].answer == "Self-care is important" and qas[4].meta["unanswerable"] is True
    assert qas[2].evidence_turn_ids == ["D1:3", "D2:2"]  # "D1:3; D2:5" form, normalised
    assert qas[3].evidence_turn_ids == ["D2:3"]  # "D:2:3"
    assert qas[4].evidence_turn_ids == []  # "D10": not normalisable, reported
    assert qas[5].evidence_turn_ids == ["D1:4"] and qas[5].meta["evidence_raw"] == ["D1:4", "D2:9"]
    ev = loaded.report["evidence"]
    assert (ev["exact"], ev["normalized"], ev["unmatched"]) == (4, 3, 2)
    assert any("'D10'" in e for e in ev["unmatched_examples"])
    assert any("'D2:9'" in e for e in ev["unmatched_examples"])


@pytest.mark.parametrize(("mode", "answer"), [("adversarial_answer", "Self-care is important"),
                                              ("abstain", ABSTAIN_ANSWER)])
def test_adversarial_gold_option(locomo_file, mode, answer):
    qa = load_cases("locomo", locomo_file, adversarial_gold=mode).cases[0].qas[4]
    assert qa.answer == answer and qa.meta["adversarial_answer"] == "Self-care is important"


def test_folder_of_files(tmp_path, locomo_file):
    (tmp_path / "a.json").write_text(locomo_file.read_text(encoding="utf-8"), encoding="utf-8")
    other = json.loads(locomo_file.read_text(encoding="utf-8"))
    for sample in other:
        sample["sample_id"] = f"{sample['sample_id']}-b"
    (tmp_path / "b.json").write_text(json.dumps(other), encoding="utf-8")
    loaded = load_cases("locomo", tmp_path)
    assert loaded.report["files_read"] == ["a.json", "b.json"] and len(loaded.cases) == 4
