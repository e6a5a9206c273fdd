"""Data-layer faults that used to lose data silently: duplicate ids, unknown speakers, folders named
like files, over-long turns. Each is injected into a valid file; strict names the place(s), lenient
counts the skip and keeps everything else."""

from __future__ import annotations

import json

import pytest

from qgmem.data.errors import DataFormatError
from qgmem.data.loaders import load_cases
from qgmem.errors import InputPathError, UserError

from .conftest import PERSON, convomem_item, write_core


def _write(path, doc):
    path.write_text(json.dumps(doc, ensure_ascii=False), encoding="utf-8")
    return path


@pytest.fixture()
def locomo_doc(locomo_file):
    return json.loads(locomo_file.read_text(encoding="utf-8"))


@pytest.fixture()
def longmemeval_doc(longmemeval_file):
    return json.loads(longmemeval_file.read_text(encoding="utf-8"))


# --- duplicate ids ---------------------------------------------------------------------------------

@pytest.mark.parametrize(("dataset", "doc_fixture", "id_key"), [
    ("locomo", "locomo_doc", "sample_id"),
    ("longmemeval", "longmemeval_doc", "question_id"),
])
def test_duplicate_id_in_one_file_names_both_places(request, tmp_path, dataset, doc_fixture, id_key):
    doc = request.getfixturevalue(doc_fixture)
    doc.append(json.loads(json.dumps(doc[0])))  # item 2 repeats item 0's id
    path = _write(tmp_path / "data.json", doc)
    with pytest.raises(DataFormatError) as err:
        load_cases(dataset, path)
    assert (err.value.file, err.value.item, err.value.field) == ("data.json", 2, id_key)
    assert f"duplicate {id_key} {doc[0][id_key]!r}: already used at file data.json, item 0" in str(err.value)
    loaded = load_cases(dataset, path, strict=False)
    assert [c.id for c in loaded.cases] == [str(d[id_key]) for d in doc[:2]]  # first use kept, repeat skipped
    assert loaded.report["skipped"] == 1 and "duplicate" in loaded.report["skip_reasons"][0]


@pytest.mark.parametrize(("dataset", "doc_fixture", "id_key"), [
    ("locomo", "locomo_doc", "sample_id"),
    ("longmemeval", "longmemeval_doc", "question_id"),
])
def test_duplicate_id_across_files(request, tmp_path, dataset, doc_fixture, id_key):
    doc = request.getfixturevalue(doc_fixture)
    _write(tmp_path / "a.json", doc)
    _write(tmp_path / "b.json", doc[1:])
    with pytest.raises(DataFormatError, match=rf"file b.json, item 0, field {id_key}: duplicate .* "
                                              r"already used at file a.json, item 1"):
        load_cases(dataset, tmp_path)
    loaded = load_cases(dataset, tmp_path, strict=False)
    assert len(loaded.cases) == len(doc) and loaded.report["skipped"] == 1


def test_convomem_conversation_claimed_by_two_items(tmp_path):
    items = [convomem_item(i) for i in range(3)]
    items[2]["conversations"] = json.loads(json.dumps(items[0]["conversations"]))  # item 2 repeats item 0's
    write_core(tmp_path, "user_evidence", items)
    with pytest.raises(DataFormatError) as err:
        load_cases("convomem", tmp_path)
    assert err.value.item == 2 and err.value.field == "conversations[0].id"
    assert f"duplicate conversation id 'conv-{PERSON}-0' of person '{PERSON}': already used at file " in str(err.value)
    assert "item 0, field conversations[0].id" in str(err.value)
    loaded = load_cases("convomem", tmp_path, strict=False)
    assert [c.source["item"] for c in loaded.cases] == [0, 1] and loaded.report["skipped"] == 1


def test_convomem_same_id_for_two_persons_is_fine(tmp_path):
    write_core(tmp_path, "user_evidence", [convomem_item(0, "p1")], person="p1")
    other = convomem_item(0, "p2")
    other["conversations"][0]["id"] = "conv-p1-0"
    write_core(tmp_path, "user_evidence", [other], person="p2")
    assert len(load_cases("convomem", tmp_path).cases) == 2


# --- unknown speakers ------------------------------------------------------------------------------

def test_locomo_unknown_speaker_is_an_error(tmp_path, locomo_doc):
    locomo_doc[1]["conversation"]["session_1"][1]["speaker"] = "Narrator"
    path = _write(tmp_path / "l.json", locomo_doc)
    with pytest.raises(DataFormatError, match=r"unknown speaker 'Narrator' \(expected speaker_a") as err:
        load_cases("locomo", path)
    assert (err.value.item, err.value.field) == (1, "conversation.session_1[1].speaker")
    loaded = load_cases("locomo", path, strict=False)
    assert [c.id for c in loaded.cases] == [locomo_doc[0]["sample_id"]] and loaded.report["skipped"] == 1
    assert {t.role for t in loaded.cases[0].dialogue.turns()} == {"speaker_a", "speaker_b"}


# --- folders where files are expected --------------------------------------------------------------

@pytest.mark.parametrize("strict", [True, False])
@pytest.mark.parametrize(("dataset", "doc_fixture"), [("locomo", "locomo_doc"), ("longmemeval", "longmemeval_doc")])
def test_folder_named_like_a_file_is_a_named_error(request, tmp_path, dataset, doc_fixture, strict):
    _write(tmp_path / "a.json", request.getfixturevalue(doc_fixture))
    (tmp_path / "b.json").mkdir()
    with pytest.raises(InputPathError, match="b.json: is a folder, but a JSON file is expected") as err:
        load_cases(dataset, tmp_path, strict=strict)
    assert isinstance(err.value, UserError) and not isinstance(err.value, IsADirectoryError)


@pytest.mark.parametrize("strict", [True, False])
def test_convomem_folder_named_like_a_file(tmp_path, strict):
    write_core(tmp_path, "user_evidence", [convomem_item(0)])
    (tmp_path / "core_benchmark" / "evidence_questions" / "user_evidence" / "1_evidence" / "x_Tester.json").mkdir()
    with pytest.raises(InputPathError, match="x_Tester.json: is a folder"):
        load_cases("convomem", tmp_path, strict=strict)


# --- over-long turns -------------------------------------------------------------------------------

def _long_text(n: int) -> str:
    return ("word " * (n // 5 + 1))[:n]


@pytest.mark.parametrize("cap", [1_000, 5_000])
def test_locomo_long_turn_is_cut_and_counted(tmp_path, locomo_file, locomo_doc, cap):
    locomo_doc[0]["conversation"]["session_1"][0]["text"] = _long_text(1_000_000)
    path = _write(tmp_path / "l.json", locomo_doc)
    loaded = load_cases("locomo", path, max_turn_chars=cap)
    turn = loaded.cases[0].dialogue.sessions[0].turns[0]
    assert cap - 200 <= len(turn.text) <= cap and turn.text == _long_text(1_000_000)[: len(turn.text)]
    assert loaded.report["truncated_turns"] == 1 and loaded.report["max_turn_chars"] == cap
    assert "field conversation.session_1[0].text: 1000000 chars cut to" in loaded.report["truncated_examples"][0]
    untouched = load_cases("locomo", locomo_file).cases
    assert [t.text for c in loaded.cases for t in c.dialogue.turns()][1:] == \
        [t.text for c in untouched for t in c.dialogue.turns()][1:]  # nothing else changed


def test_default_cap_applies_and_is_reported(tmp_path, longmemeval_doc):
    from qgmem.data._common import DEFAULT_MAX_TURN_CHARS

    longmemeval_doc[0]["haystack_sessions"][0][0]["content"] = "x" * (DEFAULT_MAX_TURN_CHARS * 3)
    loaded = load_cases("longmemeval", _write(tmp_path / "m.json", longmemeval_doc))
    turn = loaded.cases[0].dialogue.sessions[0].turns[0]
    assert len(turn.text) == DEFAULT_MAX_TURN_CHARS and loaded.report["truncated_turns"] == 1
    assert "haystack_sessions[0][0].content" in loaded.report["truncated_examples"][0]


def test_convomem_long_message_is_cut(tmp_path):
    item = convomem_item(0)
    item["conversations"][0]["messages"][3]["text"] = _long_text(50_000)
    write_core(tmp_path, "user_evidence", [item])
    loaded = load_cases("convomem", tmp_path, max_turn_chars=300)
    texts = [t.text for t in loaded.cases[0].dialogue.turns()]
    assert max(len(t) for t in texts) <= 300 and loaded.report["truncated_turns"] == 1
    assert loaded.cases[0].qas[0].evidence_turn_ids  # the evidence (another message) still maps


@pytest.mark.parametrize("cap", [0, -5, 1.5, True])
def test_bad_cap_is_rejected(locomo_file, cap):
    with pytest.raises(ValueError, match="max_turn_chars must be an integer >= 1"):
        load_cases("locomo", locomo_file, max_turn_chars=cap)


def test_lone_surrogate_is_a_named_error(tmp_path, locomo_doc):
    locomo_doc[0]["conversation"]["session_1"][2]["text"] = "broken \udcff text"
    path = tmp_path / "s.json"
    path.write_text(json.dumps(locomo_doc), encoding="utf-8")  # escaped as \\udcff: valid JSON, invalid text
    with pytest.raises(DataFormatError, match=r"lone surrogate '\\udcff' at character 7") as err:
        load_cases("locomo", path)
    assert (err.value.item, err.value.field) == (0, "conversation.session_1[2].text")
    assert len(load_cases("locomo", path, strict=False).cases) == 1


# --- second round: skipped records count nowhere, repeated turn/session ids, empty texts ------------

@pytest.mark.parametrize(("dataset", "fixture"), [("locomo", "locomo_file"), ("longmemeval", "longmemeval_file")])
def test_skipped_duplicates_add_nothing_to_the_evidence_counts(request, tmp_path, dataset, fixture):
    source = request.getfixturevalue(fixture)
    once = load_cases(dataset, source)
    (tmp_path / "a.json").write_bytes(source.read_bytes())
    (tmp_path / "b.json").write_bytes(source.read_bytes())  # the same file twice: every item a duplicate
    twice = load_cases(dataset, tmp_path, strict=False)
    assert twice.report["skipped"] == len(once.cases)
    assert twice.report["evidence"] == once.report["evidence"]  # was: every count doubled ("of 18" for 9)
    assert once.report["evidence"]["total"] > 0


def test_skipped_record_adds_no_cut_turns(tmp_path, locomo_doc):
    locomo_doc[1]["conversation"]["session_1"][0]["text"] = "word " * 400
    locomo_doc[1]["qa"][0]["category"] = 9  # the sample is skipped after its long turn was cut
    loaded = load_cases("locomo", _write(tmp_path / "d.json", locomo_doc), strict=False, max_turn_chars=100)
    assert loaded.report["skipped"] == 1 and loaded.report["truncated_turns"] == 0


def test_locomo_repeated_dia_id_names_the_id_and_both_turns(tmp_path, locomo_doc):
    conv = locomo_doc[0]["conversation"]
    conv["session_2"][1]["dia_id"] = conv["session_1"][0]["dia_id"]
    path = _write(tmp_path / "d.json", locomo_doc)
    with pytest.raises(DataFormatError) as err:
        load_cases("locomo", path)
    assert (err.value.item, err.value.field) == (0, "conversation.session_2[1].dia_id")
    assert "repeated dia_id 'D1:1': already used at conversation.session_1[0]" in str(err.value)
    loaded = load_cases("locomo", path, strict=False)
    assert loaded.report["skipped"] == 1 and [c.id for c in loaded.cases] == [locomo_doc[1]["sample_id"]]


def test_longmemeval_repeated_haystack_session_id_is_an_error(tmp_path, longmemeval_doc):
    ids = longmemeval_doc[0]["haystack_session_ids"]
    ids[1] = ids[0]
    path = _write(tmp_path / "d.json", longmemeval_doc)
    with pytest.raises(DataFormatError) as err:
        load_cases("longmemeval", path)
    assert (err.value.item, err.value.field) == (0, "haystack_session_ids[1]")
    assert f"repeated session id {ids[0]!r}: already haystack_session_ids[0]" in str(err.value)
    loaded = load_cases("longmemeval", path, strict=False)
    assert loaded.report["skipped"] == 1 and [c.id for c in loaded.cases] == [longmemeval_doc[1]["question_id"]]


@pytest.mark.parametrize("key", ["question", "answer"])
@pytest.mark.parametrize("blank", ["", "  \n"])
def test_empty_question_or_answer_is_an_error(tmp_path, locomo_doc, longmemeval_doc, key, blank):
    locomo_doc[0]["qa"][1][key] = blank
    longmemeval_doc[0][key] = blank
    item = convomem_item(0)
    item[key] = blank
    write_core(tmp_path / "convomem", "user_evidence", [item, convomem_item(1)])
    cases = [("locomo", _write(tmp_path / "l.json", locomo_doc), f"qa[1].{key}"),
             ("longmemeval", _write(tmp_path / "m.json", longmemeval_doc), key),
             ("convomem", tmp_path / "convomem", key)]
    for dataset, path, field in cases:
        options = {"distractor_conversations": 0} if dataset == "convomem" else {}
        with pytest.raises(DataFormatError) as err:
            load_cases(dataset, path, **options)
        assert (err.value.item, err.value.field) == (0, field) and str(err.value).endswith("empty text")
        loaded = load_cases(dataset, path, strict=False, **options)
        assert loaded.report["skipped"] == 1 and len(loaded.cases) == 1
