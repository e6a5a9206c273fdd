"""Answer metrics over a run: exact match and token F1 with the one normalizer (:mod:`qgmem.text`).

:class:`AnswerScores` keeps summed states, so it reduces across DDP processes; the per-answer rules are
:func:`qgmem.text.exact_match` and :func:`qgmem.text.token_f1` (SQuAD convention), the same ones
``qgmem eval-qa`` reports.
"""

from __future__ import annotations

import torch
from torchmetrics import Metric

from qgmem.text import exact_match, token_f1


class AnswerScores(Metric):
    """Mean exact match and token F1 in ``[0, 1]`` over (prediction, reference) strings; DDP-synchronized."""

    full_state_update = False

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.add_state("em_sum", default=torch.tensor(0.0, dtype=torch.float64), dist_reduce_fx="sum")
        self.add_state("f1_sum", default=torch.tensor(0.0, dtype=torch.float64), dist_reduce_fx="sum")
        self.add_state("total", default=torch.tensor(0, dtype=torch.long), dist_reduce_fx="sum")

    def update(self, predictions: list[str], references: list[str]) -> None:
        if len(predictions) != len(references):
            raise ValueError(f"{len(predictions)} predictions for {len(references)} references")
        self.em_sum += sum(exact_match(p, r) for p, r in zip(predictions, references))
        self.f1_sum += sum(token_f1(p, r) for p, r in zip(predictions, references))
        self.total += len(predictions)

    def compute(self) -> dict[str, torch.Tensor]:
        n = self.total.clamp(min=1).double()
        return {"em": (self.em_sum / n).float(), "f1": (self.f1_sum / n).float()}
