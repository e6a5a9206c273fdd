"""AnswerScores: the run-level mean of the shared exact match and token F1."""

from __future__ import annotations

import pytest
import torch

from qgmem.text import exact_match, token_f1
from qgmem.training.metrics import AnswerScores

PAIRS = [("The Eiffel Tower.", "eiffel tower"), ("blue and green", "Blue"), ("It is in Paris, France", "Paris"),
         ("no idea", "Lisbon"), ("An apple a day", "apple day"), ("", "")]


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

