"""Bad input: strict mode names file, item and field; lenient mode counts the skip and loses nothing else."""

from __future__ import annotations

import json

import pytest

from qgmem.data.errors import DataFormatError
from qgmem.data.loaders import load_cases

from .conftest import convomem_item, write_core

CORE = "core_benchmark/evidence_questions/user_evidence/1_evidence/person-1_Tester.json"


def _missing_question(items):
    del items[1]["question"]


def _wrong_answer_type(items):
    items[1]["answer"] = ["not", "a", "string"]


def _empty_conversation(items):
    items[1]["conversations"][0]["messages"] = []


def _unknown_speaker(items):
    items[1]["conversations"][0]["messages"][1]["speaker"] = "Narrator"


def _conversations_not_a_list(items):
    items[1]["conversations"] = {"messages": []}


@pytest.mark.parametrize(
    ("damage", "field"),
    [
        (_missing_question, "question"),
        (_wrong_answer_type, "answer"),
        (_empty_conversation, "conversations[0].messages"),
        (_unknown_speaker, "conversations[0].messages[1].speaker"),
        (_conversations_not_a_list, "conversations"),
    ],
)
def test_convomem_bad_item(tmp_path, damage, field):
    items = [convomem_item(i) for i in range(3)]
    damage(items)
    write_core(tmp_path, "user_evidence", items)
    with pytest.raises(DataFormatError) as err:
        load_cases("convomem", tmp_path)
    assert (err.value.file, err.value.item, err.value.field) == (CORE, 1, field)
    assert CORE in str(err.value) and "item 1" in str(err.value) and field in str(err.value)
    loaded = load_cases("convomem", tmp_path, strict=False)
    assert loaded.report["skipped"] == 1 and field in loaded.report["skip_reasons"][0]
    assert [c.source["item"] for c in loaded.cases] == [0, 2] and loaded.report["items"] == 3


def test_convomem_malformed_json(tmp_path):
    write_core(tmp_path, "user_evidence", [convomem_item(0, "person-2")], person="person-2")
    write_core(tmp_path, "user_evidence", '{"evidence_items": [{"question": "cut off', person="person-1")
    with pytest.raises(DataFormatError, match="malformed JSON") as err:
        load_cases("convomem", tmp_path)
    assert err.value.file == CORE and err.value.field == "<document>"
    loaded = load_cases("convomem", tmp_path, strict=False)
    assert loaded.report["skipped"] == 1 and len(loaded.cases) == 1
    assert loaded.cases[0].source["person_id"] == "person-2"


def test_convomem_unknown_category_folder(tmp_path):
    write_core(tmp_path, "user_evidence", [convomem_item(0)])
    write_core(tmp_path, "gossip_evidence", [convomem_item(1)])
    with pytest.raises(DataFormatError, match="unknown category folder 'gossip_evidence'") as err:
        load_cases("convomem", tmp_path)
    assert err.value.file.startswith("core_benchmark/evidence_questions/gossip_evidence/")
    loaded = load_cases("convomem", tmp_path, strict=False)
    assert loaded.report["skipped"] == 1 and [c.qas[0].category for c in loaded.cases] == ["user_evidence"]


def test_convomem_missing_evidence_items_key(tmp_path):
    write_core(tmp_path, "user_evidence", json.dumps({"items": []}))
    with pytest.raises(DataFormatError) as err:
        load_cases("convomem", tmp_path)
    assert err.value.field == "evidence_items"


def _locomo_missing_question(doc):
    del doc[1]["qa"][0]["question"]


def _locomo_bad_category(doc):
    doc[1]["qa"][0]["category"] = "4"


def _locomo_empty_session(doc):
    doc[1]["conversation"]["session_1"] = []


def _locomo_bad_date(doc):
    doc[1]["conversation"]["session_1_date_time"] = "sometime in summer"


def _locomo_no_answer(doc):
    del doc[1]["qa"][0]["answer"]


@pytest.mark.parametrize(
    ("damage", "field"),
    [
        (_locomo_missing_question, "qa[0].question"),
        (_locomo_bad_category, "qa[0].category"),
        (_locomo_empty_session, "conversation.session_1"),
        (_locomo_bad_date, "conversation.session_1_date_time"),
        (_locomo_no_answer, "qa[0].answer"),
    ],
)
def test_locomo_bad_sample(fixture_copy, damage, field):
    path = fixture_copy("locomo_small.json")
    doc = json.loads(path.read_text(encoding="utf-8"))
    damage(doc)
    path.write_text(json.dumps(doc, ensure_ascii=False), encoding="utf-8")
    with pytest.raises(DataFormatError) as err:
        load_cases("locomo", path)
    assert (err.value.file, err.value.item, err.value.field) == ("locomo_small.json", 1, field)
    loaded = load_cases("locomo", path, strict=False)
    assert loaded.report["skipped"] == 1 and [c.id for c in loaded.cases] == ["conv-fx1"]
    assert len(loaded.cases[0].qas) == 6


def _lme_wrong_type(doc):
    doc[0]["question"] = 42


def _lme_empty_session(doc):
    doc[0]["haystack_sessions"][1] = []


def _lme_length_mismatch(doc):
    doc[0]["haystack_dates"].pop()


def _lme_bad_role(doc):
    doc[0]["haystack_sessions"][0][0]["role"] = "system"


@pytest.mark.parametrize(
    ("damage", "field"),
    [
        (_lme_wrong_type, "question"),
        (_lme_empty_session, "haystack_sessions[1]"),
        (_lme_length_mismatch, "haystack_sessions"),
        (_lme_bad_role, "haystack_sessions[0][0].role"),
    ],
)
def test_longmemeval_bad_entry(fixture_copy, damage, field):
    path = fixture_copy("longmemeval_small.json")
    doc = json.loads(path.read_text(encoding="utf-8"))
    damage(doc)
    path.write_text(json.dumps(doc, ensure_ascii=False), encoding="utf-8")
    with pytest.raises(DataFormatError) as err:
        load_cases("longmemeval", path)
    assert (err.value.file, err.value.item, err.value.field) == ("longmemeval_small.json", 0, field)
    loaded = load_cases("longmemeval", path, strict=False)
    assert loaded.report["skipped"] == 1 and [c.id for c in loaded.cases] == ["gpt4_2655b836_abs"]


@pytest.mark.parametrize("dataset", ["locomo", "longmemeval"])
def test_malformed_json_other_datasets(tmp_path, dataset):
    (tmp_path / "bad.json").write_text("[{", encoding="utf-8")
    with pytest.raises(DataFormatError, match="malformed JSON") as err:
        load_cases(dataset, tmp_path / "bad.json")
    assert err.value.file == "bad.json"
    loaded = load_cases(dataset, tmp_path / "bad.json", strict=False)
    assert loaded.report["skipped"] == 1 and loaded.cases == []
