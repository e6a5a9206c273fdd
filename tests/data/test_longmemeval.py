"""LongMemEval loader on the small fixture in the longmemeval_s form."""

from __future__ import annotations

import json

from qgmem.data.loaders import load_cases


def test_cases_turns_times_and_evidence(longmemeval_file):
    raw = json.loads(longmemeval_file.read_text(encoding="utf-8"))
    loaded = load_cases("longmemeval", longmemeval_file)
    assert [c.id for c in loaded.cases] == [e["question_id"] for e in raw]
    first, second = loaded.cases
    qa = first.qas[0]
    assert qa.category == "single-session-user" and qa.question_time == "2023-05-30T23:40:00"
    assert qa.evidence_turn_ids == ["answer_280352e9:0"]
    assert [s.id for s in first.dialogue.sessions] == ["sharegpt_yywfAjt_0", "answer_280352e9"]
    assert [s.time for s in first.dialogue.sessions] == ["2023-05-20T02:21:00", "2023-05-26T14:05:00"]
    assert [t.role for t in first.dialogue.sessions[1].turns] == ["user", "assistant", "user"]
    assert first.dialogue.sessions[1].meta["answer_session"] is True
    assert [t.text for t in first.dialogue.turns()] == [t["content"] for s in raw[0]["haystack_sessions"] for t in s]
    assert second.qas[0].answer == "0" and second.qas[0].meta["abstention"] is True
    assert second.qas[0].evidence_turn_ids == []
    assert [s.id for s in second.dialogue.sessions] == ["ultrachat_1", "ultrachat_2"]
    assert "京都" in second.dialogue.turns()[0].text
    assert loaded.report["evidence"]["exact"] == 1
    assert loaded.report["categories"] == {"single-session-user": 1, "temporal-reasoning": 1}
