"""ConvoMem loader on the real sample (data/convomem) and on a pre-mixed fixture."""

from __future__ import annotations

import json
import re
import time
from collections import Counter
from pathlib import Path

import pytest

from qgmem.data.convomem import BENCHMARK_CATEGORIES
from qgmem.data.loaders import load_cases

from .conftest import PERSON, write_core


@pytest.fixture(scope="module")
def real(convomem_path):
    start = time.perf_counter()
    loaded = load_cases("convomem", convomem_path)
    return loaded, time.perf_counter() - start


def _raw_items(root: Path) -> dict[str, list[dict]]:
    """Category → raw items, read straight from the JSON files (the test's own reference)."""
    out: dict[str, list[dict]] = {}
    for f in sorted(root.glob("core_benchmark/evidence_questions/*/*/*.json")):
        out.setdefault(f.parent.parent.name, []).extend(json.loads(f.read_text(encoding="utf-8"))["evidence_items"])
    return out


def test_real_sample_cases_and_categories(real, convomem_path):
    loaded, seconds = real
    raw = _raw_items(convomem_path)
    assert len(loaded.cases) == sum(len(v) for v in raw.values()) == 525
    assert Counter(q.category for c in loaded.cases for q in c.qas) == {k: len(v) for k, v in raw.items()}
    assert all(len(c.qas) == 1 for c in loaded.cases)
    assert loaded.report["categories"] == {k: len(v) for k, v in sorted(raw.items())}
    assert loaded.report["skipped"] == 0 and len(loaded.report["files_read"]) == 6
    assert seconds < 20, f"loading 525 cases took {seconds:.1f} s"


def test_real_sample_records_follow_conventions(real):
    loaded, _ = real
    turn_id = re.compile(r"^(.+):(\d+)$")
    for case in loaded.cases:
        qa = case.qas[0]
        assert qa.category in BENCHMARK_CATEGORIES
        assert qa.category == case.source["benchmark_category"] == Path(case.source["file"]).parts[-3]
        assert qa.meta["life_area"] and qa.meta["scenario_description"]
        for key in ("dataset", "file", "item", "person_id", "evidence_session_ids", "evidence_session_positions"):
            assert key in case.source
        assert case.source["dataset"] == "convomem" and isinstance(case.source["item"], int)
        session_ids = [s.id for s in case.dialogue.sessions]
        assert len(set(session_ids)) == len(session_ids)
        for index, turn in enumerate(case.dialogue.turns()):
            m = turn_id.match(turn.id)
            assert m and m.group(1) == turn.session_id
            assert turn.role in ("user", "assistant") and turn.speaker.lower() == turn.role
            assert turn.time is None and turn.index == index


def test_real_sample_history_and_evidence(real, convomem_path):
    loaded, _ = real
    raw = _raw_items(convomem_path)
    counts = loaded.report["evidence"]
    n_spans = sum(len(it["message_evidences"]) for items in raw.values() for it in items)
    assert counts["total"] == n_spans
    assert counts["exact"] + counts["contained"] + counts["fuzzy"] + counts["unmatched"] == n_spans
    assert counts["unmatched"] <= 0.02 * n_spans  # upstream spans are close to some message almost always
    for case in loaded.cases:
        sessions = case.dialogue.sessions
        positions = case.source["evidence_session_positions"]
        item = raw[case.source["benchmark_category"]][case.source["item"]]
        assert [sessions[p].id for p in positions] == case.source["evidence_session_ids"]
        assert [sessions[p].id for p in positions] == [c["id"] for c in item["conversations"]]  # order kept
        assert len(sessions) == len(item["conversations"]) + 6
        assert 100 <= case.dialogue.num_turns() <= 1000
        distractors = [s for i, s in enumerate(sessions) if i not in positions]
        assert all(s.meta["origin"] == "distractor" and s.meta["source_item"] != case.id for s in distractors)
        evidence_turns = {t.id for p in positions for t in sessions[p].turns}
        assert set(case.qas[0].evidence_turn_ids) <= evidence_turns
        assert len(case.qas[0].evidence_turn_ids) >= 1 or "unmatched" in case.qas[0].meta["evidence_outcomes"]


def test_real_sample_text_round_trips(convomem_path):
    """With no distractors, every turn is its raw message, byte for byte (non-ASCII included)."""
    loaded = load_cases("convomem", convomem_path, distractor_conversations=0)
    raw = _raw_items(convomem_path)
    non_ascii = 0
    for case in loaded.cases:
        item = raw[case.source["benchmark_category"]][case.source["item"]]
        expected = [m["text"] for c in item["conversations"] for m in c["messages"]]
        got = [t.text for t in case.dialogue.turns()]
        assert got == expected
        non_ascii += sum(any(ord(ch) > 127 for ch in text) for text in got)
    assert non_ascii > 0


@pytest.mark.parametrize("n_distractors", [0, 2, 4])
def test_histories_are_deterministic_and_seeded(tiny_convomem, n_distractors):
    def order(seed):
        loaded = load_cases("convomem", tiny_convomem, distractor_conversations=n_distractors, seed=seed)
        return [[s.id for s in c.dialogue.sessions] for c in loaded.cases]

    first = order(0)
    assert first == order(0)
    assert all(len(sessions) == 1 + n_distractors for sessions in first)
    if n_distractors:
        assert first != order(1)


def test_distractors_come_from_the_same_person(tiny_convomem):
    loaded = load_cases("convomem", tiny_convomem, distractor_conversations=4)
    for case in loaded.cases:
        person = case.source["person_id"]
        for session in case.dialogue.sessions:
            assert session.id.startswith(f"conv-{person}-")


def test_small_pool_gives_fewer_distractors(tmp_path):
    from .conftest import convomem_item

    write_core(tmp_path, "user_evidence", [convomem_item(i) for i in range(3)])
    loaded = load_cases("convomem", tmp_path, distractor_conversations=10)
    assert [len(c.dialogue.sessions) for c in loaded.cases] == [3, 3, 3]
    assert [c.source["distractor_sessions"] for c in loaded.cases] == [2, 2, 2]


def test_repeated_conversation_ids_made_unique(tmp_path):
    from .conftest import convomem_item

    item = convomem_item(0)
    item["conversations"].append(json.loads(json.dumps(item["conversations"][0])))
    write_core(tmp_path, "changing_evidence", [item], n_evidence=2)
    case = load_cases("convomem", tmp_path).cases[0]
    assert [s.id for s in case.dialogue.sessions] == [f"conv-{PERSON}-0", f"conv-{PERSON}-0~2"]
    assert case.dialogue.sessions[1].turns[0].id == f"conv-{PERSON}-0~2:0"


def test_path_may_be_a_category_folder_or_a_file(tiny_convomem):
    folder = tiny_convomem / "core_benchmark" / "evidence_questions" / "user_evidence"
    assert len(load_cases("convomem", folder).cases) == 6
    file = next(folder.rglob("*.json"))
    loaded = load_cases("convomem", file)
    assert len(loaded.cases) == 3 and loaded.cases[0].qas[0].category == "user_evidence"


def test_premixed_used_as_is(premixed_root):
    loaded = load_cases("convomem", premixed_root)
    raw = json.loads(next(premixed_root.rglob("batched_*.json")).read_text(encoding="utf-8"))
    assert loaded.report["forms"] == {"core": 0, "pre_mixed": 1}
    assert len(loaded.cases) == len(raw[0]["evidenceItems"]) == 2
    first, second = loaded.cases
    assert first.dialogue is second.dialogue  # one mixed history shared by the group's items
    assert [s.id for s in first.dialogue.sessions] == [c["id"] for c in raw[0]["conversations"]]
    assert first.source["evidence_session_ids"] == ["ev-1", "ev-2"]
    assert second.source["evidence_session_ids"] == ["ev-3", "ev-4"]
    assert first.qas[0].evidence_turn_ids == ["ev-1:0", "ev-2:0"]
    assert first.qas[0].meta["evidence_outcomes"] == ["contained", "exact"]
    assert second.qas[0].answer == "Orange" and second.qas[0].category == "changing_evidence"
    assert first.source["person_id"] == "person-fx" and first.source["context_size"] == 6
    assert "“green for go”" in second.dialogue.sessions[2].turns[1].text


def test_hub_id_offline_is_a_clear_error(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(FileNotFoundError, match="Salesforce/ConvoMem"):
        load_cases("convomem", "Salesforce/ConvoMem-not-cached-here")


def test_missing_path_and_empty_folder(tmp_path):
    with pytest.raises(FileNotFoundError):
        load_cases("convomem", tmp_path / "nope")
    with pytest.raises(FileNotFoundError, match="no ConvoMem files"):
        load_cases("convomem", tmp_path)


@pytest.mark.parametrize(("form", "n_cases", "forms"), [("auto", 10, {"core": 4, "pre_mixed": 0}),
                                                        ("core", 10, {"core": 4, "pre_mixed": 0}),
                                                        ("pre_mixed", 2, {"core": 0, "pre_mixed": 1})])
def test_form_choice_when_both_forms_are_present(tiny_convomem, premixed_root, form, n_cases, forms):
    import shutil

    shutil.copytree(premixed_root / "core_benchmark" / "pre_mixed_testcases",
                    tiny_convomem / "core_benchmark" / "pre_mixed_testcases")
    loaded = load_cases("convomem", tiny_convomem, form=form)
    assert len(loaded.cases) == n_cases and loaded.report["forms"] == forms


def test_bad_options_rejected(tiny_convomem):
    with pytest.raises(ValueError, match="form"):
        load_cases("convomem", tiny_convomem, form="both")
    with pytest.raises(ValueError, match="distractor_conversations"):
        load_cases("convomem", tiny_convomem, distractor_conversations=-1)


def test_session_id_names_repeats_and_interleave_mixes_any_items():
    import random

    from qgmem.data.convomem_history import REPEAT, interleave, session_id

    assert (session_id("c-1", 1), session_id("c-1", 2), session_id("c-1", 3)) == ("c-1", "c-1~2", "c-1~3")
    assert REPEAT == "~"
    mixed, positions = interleave(["e1", "e2"], ["d1", "d2", "d3"], random.Random(0))
    assert sorted(mixed) == ["d1", "d2", "d3", "e1", "e2"] and len(positions) == 2
    assert [mixed[p] for p in positions] == ["e1", "e2"]  # the evidence keeps its order
    assert [x for x in mixed if x.startswith("d")] == ["d1", "d2", "d3"]
