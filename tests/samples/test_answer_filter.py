"""Answer filtering: the rule names, rubric handling, the report and the frozen-LM answerer."""

from __future__ import annotations

import pytest

from qgmem.samples.answer_filter import RUBRIC_CATEGORIES, FilterReport, MatchJudge, decide, make_judge


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


def test_lm_answerer_with_tiny_random_lm_is_batched_and_deterministic(tmp_path):
    """Left-padded batches give the same greedy answers as one-at-a-time generation."""
    from qgmem.model.random_lm import save_random_lm
    from qgmem.samples.answer_filter import LMAnswerer

    path = save_random_lm(tmp_path / "tiny-lm", hidden_size=32, layers=1, heads=2, kv_heads=1)
    pairs = [("[M1] The user marks hot leads green.", "Which color marks hot leads?"),
             ("[M1] a\n[M2] much longer memory text " * 5, "What?"),
             ("", "Anything?")]
    from qgmem.prompting import PromptSettings

    prompt = PromptSettings(max_prompt_tokens=128)
    batched = LMAnswerer(str(path), prompt=prompt, batch_size=3, max_new_tokens=6).answer(pairs)
    single = LMAnswerer(str(path), prompt=prompt, batch_size=1, max_new_tokens=6).answer(pairs)
    assert len(batched) == 3 and all(isinstance(a, str) for a in batched)
    assert batched == single


def test_the_answers_key_holds_the_answer_cut_s_version(monkeypatch):
    """Cached answers were cut by one version of the answer cut: another version keys other answers (and,
    under a filter, another dataset), so a cut that reads replies differently never reuses them."""
    from qgmem.prompting import answer
    from qgmem.samples.answer_filter import LMAnswerer

    before = LMAnswerer("some-lm").settings
    assert before["answer_cut"] == answer.ANSWER_CUT_VERSION
    monkeypatch.setattr(answer, "ANSWER_CUT_VERSION", answer.ANSWER_CUT_VERSION + 1)
    assert LMAnswerer("some-lm").settings != before
