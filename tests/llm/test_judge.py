"""Judging answers: the match rule, the LLM judge's instructions and verdicts, the shared backend."""

from __future__ import annotations

import pytest

from qgmem.text import token_f1
from qgmem.llm.judge import (JudgeItem, LLMJudge, MatchRule, backend_completer, judge_messages, judge_system_prompt,
                              parse_verdict)

ABSTAIN_REF = "There is no information in prior conversations to answer this question"


@pytest.mark.parametrize("prediction,reference,expected", [
    ("green", "Green", True),  # exact after normalization
    ("I use green for hot leads.", "Green", True),  # reference inside prediction
    ("Sarah Jenkins.", "The designated contact person is Sarah Jenkins.", True),  # 2-token prediction inside
    ("Sarah", "The designated contact person is Sarah Jenkins.", False),  # too short to count
    ("greenish", "Green", False),  # word boundaries, not substrings
    ("Blue", "Green", False),
    ("", "Green", False),
    ("I don't know.", ABSTAIN_REF, True),  # abstention reference wants an abstention
    ("The memory does not contain that information.", ABSTAIN_REF, True),
    ("Green", ABSTAIN_REF, False),
    ("I don't know, maybe green", "Green", False),  # abstaining never matches a real answer
])
def test_match_rule(prediction, reference, expected):
    assert MatchRule()(prediction, reference) is expected


@pytest.mark.parametrize("threshold,expected", [(None, False), (0.3, True), (0.9, False)])
def test_match_rule_optional_f1(threshold, expected):
    pred, ref = "the meeting is remote now", "The meeting has been changed to be fully remote"
    assert token_f1(pred, ref) == pytest.approx(1 / 3)  # 2 shared of 4 predicted and 8 reference tokens
    assert MatchRule(f1_threshold=threshold)(pred, ref) is expected


@pytest.mark.parametrize("reply,expected", [
    ("The reply names the same color.\nVERDICT: CORRECT", True),
    ("VERDICT: INCORRECT", False),
    ("<think>CORRECT? no</think>VERDICT: INCORRECT", False),
    ("first I thought INCORRECT, but VERDICT: correct", True),
    ("no verdict here", None),
])
def test_parse_verdict(reply, expected):
    assert parse_verdict(reply) is expected


def test_judge_messages_use_rubric_wording_for_rubric_categories():
    plain = judge_messages(JudgeItem("Q?", "Green", "green", "user_evidence"))
    rubric = judge_messages(JudgeItem("Q?", "A good response should ...", "Try Trello.", "preference_evidence"))
    assert "Reference answer: Green" in plain[1]["content"]
    assert "Rubric: A good response should ..." in rubric[1]["content"]
    assert plain[0]["content"] != rubric[0]["content"]


def test_llm_judge_counts_unparsed_as_incorrect():
    replies = iter(["VERDICT: CORRECT", "I am not sure", "VERDICT: INCORRECT"])
    judge = LLMJudge(lambda batch: [next(replies) for _ in batch])
    items = [JudgeItem("q", "r", "p", "user_evidence")] * 3
    assert judge(items) == [True, False, False]
    assert judge.unparsed == 1


def test_backend_completer_with_the_shared_backend():
    from qgmem.llm.backends import CallableBackend

    def fn(messages):
        if "boom" in messages[-1]["content"]:
            raise RuntimeError("server down")
        return "VERDICT: CORRECT" if "green" in messages[-1]["content"] else "VERDICT: INCORRECT"

    backend = CallableBackend(fn)
    judge = LLMJudge(backend_completer(backend))
    items = [JudgeItem("q", "Green", "green", "user_evidence"), JudgeItem("q", "Green", "blue", "user_evidence"),
             JudgeItem("q", "Green", "boom", "user_evidence")]
    assert judge(items) == [True, False, False]
    assert judge.unparsed == 1 and judge.failed == 1  # the failed request: no reply, not a verdict
    assert backend.usage.requests == 3 and backend.usage.errors == 1


@pytest.mark.parametrize("item,must_have,must_not", [
    (JudgeItem("Q?", "Green", "green", "user_evidence", "convomem"), "even in different words", "off by one"),
    (JudgeItem("How many days?", "18 days", "19 days", "temporal-reasoning", "longmemeval"), "off by one", "rubric"),
    (JudgeItem("Q?", ABSTAIN_REF, "Green", "abstention_evidence", "convomem"), "do not contain the answer",
     "off by one"),
    (JudgeItem("Q?", "Paris", "I don't know", "single-session-user", "longmemeval", abstention=True),
     "do not contain the answer", "off by one"),
    (JudgeItem("Q?", "A good response should ...", "Try Trello.", "preference_evidence"), "rubric", "off by one"),
])
def test_judge_instructions_follow_the_item(item, must_have, must_not):
    prompt = judge_system_prompt(item)
    assert must_have in prompt and must_not not in prompt and prompt.endswith("'VERDICT: INCORRECT'.")


def test_judge_instructions_state_the_grading_rules():
    prompt = judge_system_prompt(JudgeItem("Q?", "Green", "green"))
    for rule in ("contradicts", "leaves out a detail", "too vague", "does not support", "current value"):
        assert rule in prompt


def test_a_request_without_a_reply_is_counted_as_failed_not_only_unparsed():
    judge = LLMJudge(lambda batch: ["VERDICT: CORRECT", None, "no verdict here"][: len(batch)])
    assert judge([JudgeItem("q", "r", "p", "user_evidence")] * 3) == [True, False, False]
    assert judge.failed == 1 and judge.unparsed == 2
