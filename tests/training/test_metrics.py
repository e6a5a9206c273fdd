"""Answer metrics agree with torchmetrics' SQuAD scoring and handle the edge cases."""

from __future__ import annotations

import pytest
import torch
from torchmetrics.text import SQuAD

from qgmem.training.metrics import AnswerScores, contains_answer, exact_match, normalize_answer, token_f1

PAIRS = [("The Eiffel Tower.", "eiffel tower"), ("blue and green", "Blue"), ("It is in Paris, France", "Paris"),
         ("no idea", "Lisbon"), ("An apple a day", "apple day"), ("", "")]


@pytest.mark.parametrize("text,expected", [("The  Quick, brown FOX!", "quick brown fox"), ("a an the", ""),
                                           ("Theater", "theater")])
def test_normalize_answer(text, expected):
    assert normalize_answer(text) == expected


@pytest.mark.parametrize("pred,ref", PAIRS)
def test_scores_match_torchmetrics_squad(pred, ref):
    squad = SQuAD()(
        [{"prediction_text": pred, "id": "0"}], [{"answers": {"answer_start": [0], "text": [ref]}, "id": "0"}])
    assert exact_match(pred, ref) == pytest.approx(squad["exact_match"].item() / 100)
    assert token_f1(pred, ref) == pytest.approx(squad["f1"].item() / 100, abs=1e-6)


def test_answer_scores_accumulate():
    metric = AnswerScores()
    metric.update([p for p, _ in PAIRS[:3]], [r for _, r in PAIRS[:3]])
    metric.update([p for p, _ in PAIRS[3:5]], [r for _, r in PAIRS[3:5]])
    out = metric.compute()
    em = sum(exact_match(p, r) for p, r in PAIRS[:5]) / 5
    f1 = sum(token_f1(p, r) for p, r in PAIRS[:5]) / 5
    assert set(out) == {"em", "f1"}
    torch.testing.assert_close(out["em"], torch.tensor(em), atol=1e-6, rtol=0)
    torch.testing.assert_close(out["f1"], torch.tensor(f1), atol=1e-6, rtol=0)
    metric.reset()
    metric.update(["x"], ["x"])
    assert metric.compute()["em"].item() == 1.0
    with pytest.raises(ValueError, match="2 predictions for 1 references"):
        metric.update(["a", "b"], ["a"])


@pytest.mark.parametrize("pred,ref,expected", [("It is in Paris, France", "paris", True), ("Parisian", "Paris", False),
                                               ("anything", "", False)])
def test_contains_answer(pred, ref, expected):
    assert contains_answer(pred, ref) is expected
