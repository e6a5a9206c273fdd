"""Answer filtering: normalization, the match rule, LLM verdicts, rubric handling and the report."""

from __future__ import annotations

import pytest

from qgmem.training.answer_filter import (RUBRIC_CATEGORIES, FilterReport, JudgeItem, LLMJudge, MatchJudge,
                                          MatchRule, backend_completer, decide, is_abstention, judge_messages,
                                          make_judge, normalize_answer, parse_verdict, strip_reply, token_f1)

ABSTAIN_REF = "There is no information in prior conversations to answer this question"


@pytest.mark.parametrize("text,expected", [
    ("The  Green!", "green"),
    ("Innovate$2024!Lead", "innovate 2024 lead"),
    ("I don’t know.", "i don t know"),
    ("<think>maybe red</think> Blue", "blue"),
    ("", ""),
])
def test_normalize_answer(text, expected):
    assert normalize_answer(text) == expected


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


def test_token_f1_values():
    assert token_f1("green red", "green") == pytest.approx(2 * 0.5 * 1.0 / 1.5)
    assert token_f1("", "green") == 0.0
    assert token_f1("blue", "green") == 0.0


@pytest.mark.parametrize("text,expected", [
    ("I don't know.", True), ("There is no information about that.", True), ("Green", False), ("", False)])
def test_is_abstention(text, expected):
    assert is_abstention(text) is expected


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
    assert judge.unparsed == 1  # the failed request
    assert backend.usage.requests == 3 and backend.usage.errors == 1


@pytest.mark.parametrize("rule,kind", [("none", type(None)), ("match", MatchJudge)])
def test_make_judge(rule, kind):
    assert isinstance(make_judge(rule), kind)


def test_make_judge_rejects_unknown_rule_and_llm_without_config():
    with pytest.raises(ValueError, match="answer_filter"):
        make_judge("exact")
    with pytest.raises(ValueError, match="LLMConfig"):
        make_judge("llm", None)


@pytest.mark.parametrize("category,rule,correct,keep,target,reason", [
    ("user_evidence", "match", True, True, "Green", "kept"),
    ("user_evidence", "match", False, False, "", "incorrect"),
    ("user_evidence", "none", None, True, "Green", "unfiltered"),
    ("user_evidence", "llm", True, True, "Green", "kept"),  # non-rubric: the reference is the target
    ("preference_evidence", "match", True, False, "", "rubric_no_judge"),
    ("implicit_connection_evidence", "none", None, False, "", "rubric_no_judge"),
    ("preference_evidence", "llm", True, True, "Try a Kanban board.", "kept"),  # the LM's accepted answer
    ("preference_evidence", "llm", False, False, "", "incorrect"),
])
def test_decide(category, rule, correct, keep, target, reason):
    reference = "A good response should ..." if category in RUBRIC_CATEGORIES else "Green"
    decision = decide(category, reference, "Try a Kanban board.", correct, rule)
    assert (decision.keep, decision.target, decision.reason) == (keep, target, reason)


def test_filter_report_totals():
    report = FilterReport("match")
    report.add("train", "user_evidence", judged=True, correct=True, kept=True)
    report.add("train", "user_evidence", judged=True, correct=False, kept=False)
    report.add("train", "preference_evidence", judged=False, correct=False, kept=False)
    report.add("val", "user_evidence", judged=False, correct=False, kept=True)
    d = report.to_dict()
    assert d["counts"]["train"]["user_evidence"] == {"samples": 2, "judged": 2, "correct": 1, "kept": 1}
    assert d["totals"]["train"] == {"samples": 3, "judged": 2, "correct": 1, "kept": 1}
    assert d["totals"]["val"] == {"samples": 1, "judged": 0, "correct": 0, "kept": 1}


def test_strip_reply():
    assert strip_reply("<think>\nhmm\n</think>\n\n Green ") == "Green"


@pytest.mark.slow
def test_lm_answerer_with_tiny_random_lm_is_batched_and_deterministic(tmp_path):
    """Left-padded batches give the same greedy answers as one-at-a-time generation."""
    from qgmem.model.random_lm import save_random_lm
    from qgmem.training.answer_filter import LMAnswerer

    path = save_random_lm(tmp_path / "tiny-lm", hidden_size=32, layers=1, heads=2, kv_heads=1)
    pairs = [("[M1] The user marks hot leads green.", "Which color marks hot leads?"),
             ("[M1] a\n[M2] much longer memory text " * 5, "What?"),
             ("", "Anything?")]
    batched = LMAnswerer(str(path), batch_size=3, max_new_tokens=6, max_prompt_tokens=128).answer(pairs)
    single = LMAnswerer(str(path), batch_size=1, max_new_tokens=6, max_prompt_tokens=128).answer(pairs)
    assert len(batched) == 3 and all(isinstance(a, str) for a in batched)
    assert batched == single
