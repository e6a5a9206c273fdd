"""The one answer normalizer and its scores: SQuAD convention, agreement with torchmetrics, edge cases."""

from __future__ import annotations

import pytest
from torchmetrics.text import SQuAD

from qgmem.text import contains_answer, exact_match, is_abstention, normalize_answer, strip_thinking, token_f1

PAIRS = [("The Eiffel Tower.", "eiffel tower"), ("blue and green", "Blue"), ("It is in Paris, France", "Paris"),
         ("no idea", "Lisbon"), ("An apple a day", "apple day"), ("", ""), ("", "x"), ("I don't know", "dont know")]


@pytest.mark.parametrize("text,expected", [
    ("The  Quick, brown FOX!", "quick brown fox"),
    ("a an the", ""),
    ("Theater", "theater"),
    ("Innovate$2024!Lead", "innovate2024lead"),
    ("$2,000", "2000"),
    ("<think>maybe red</think> Blue", "blue"),
    ("", ""),
])
def test_normalize_answer(text, expected):
    assert normalize_answer(text) == expected


@pytest.mark.parametrize("variant", ["I don't know.", "I don’t know", "i DONT know!"])
def test_apostrophes_normalize_alike(variant):
    assert normalize_answer(variant) == "i dont know"


@pytest.mark.parametrize("pred,ref", PAIRS)
def test_scores_match_torchmetrics_squad(pred, ref):
    squad = SQuAD()(
        [{"prediction_text": pred, "id": "0"}], [{"answers": {"answer_start": [0], "text": [ref]}, "id": "0"}])
    assert exact_match(pred, ref) == pytest.approx(squad["exact_match"].item() / 100)
    assert token_f1(pred, ref) == pytest.approx(squad["f1"].item() / 100, abs=1e-6)


@pytest.mark.parametrize("pred,ref,expected", [
    ("green red", "green", 2 * 0.5 * 1.0 / 1.5),
    ("", "", 1.0),  # two empty answers agree
    ("", "green", 0.0),
    ("green", "", 0.0),
    ("blue", "green", 0.0),
    ("the the", "a", 1.0),  # both empty after normalization
])
def test_token_f1_values(pred, ref, expected):
    assert token_f1(pred, ref) == pytest.approx(expected)


@pytest.mark.parametrize("pred,ref,expected", [("It is in Paris, France", "paris", True), ("Parisian", "Paris", False),
                                               ("anything", "", False)])
def test_contains_answer(pred, ref, expected):
    assert contains_answer(pred, ref) is expected


@pytest.mark.parametrize("text,expected", [
    ("I don't know.", True), ("I don’t know.", True), ("There is no information about that.", True),
    ("The memory does not contain it.", True), ("Green", False), ("", False)])
def test_is_abstention(text, expected):
    assert is_abstention(text) is expected


@pytest.mark.parametrize("text,expected", [("<think>\nhmm\n</think>\n\n Green ", "Green"),
                                           ("<think>never closed", ""), ("plain", "plain")])
def test_strip_thinking(text, expected):
    assert strip_thinking(text) == expected


@pytest.mark.parametrize("prediction", ["2023-05-07", "May 7, 2023", "5/7/2023", "on the 7th of May 2023"])
def test_dates_are_compared_in_one_form(prediction):
    """The time resolver's ISO form: one date written four ways is one answer (EM, F1 and the match rule)."""
    from qgmem.llm.judge import JudgeItem, MatchJudge

    assert token_f1("2023-05-07", "7 May 2023") == 1.0 and exact_match("2023-05-07", "7 May 2023") == 1.0
    assert MatchJudge()([JudgeItem("When?", "7 May 2023", prediction)]) == [True]
    assert MatchJudge()([JudgeItem("When?", "8 May 2023", prediction)]) == [False]


def test_numbers_are_compared_as_digits():
    assert normalize_answer("Three dogs and 1,000 cats") == "3 dogs and 1000 cats"
    assert exact_match("twelve", "12") == 1.0 and normalize_answer("May 2023") == "202305"
    assert normalize_answer("May 7") == "may 7"  # no year, no reference date: left as written


@pytest.mark.parametrize("text,expected", [("<THINK>upper</Think>Green", "Green"),
                                           ('{"a": 1}\n<think>second thoughts', '{"a": 1}')])
def test_strip_thinking_ignores_case_and_drops_an_unclosed_block_anywhere(text, expected):
    from qgmem.llm.parsing import strip_reasoning

    assert strip_thinking(text) == expected and strip_reasoning(text) == expected  # one rule for LLM replies too
