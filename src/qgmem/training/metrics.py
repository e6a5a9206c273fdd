"""Answer metrics: SQuAD-normalized exact match and token F1 (torchmetrics), plus the normalizer itself.

``normalize_answer`` is exported so answer filtering on the data side judges "correct" with the very
normalization the validation metric uses; its equality with torchmetrics' SQuAD scoring is tested.
"""

from __future__ import annotations

import re
import string
from collections import Counter

import torch
from torchmetrics import Metric
from torchmetrics.text import SQuAD

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCT = set(string.punctuation)


def normalize_answer(text: str) -> str:
    """Lower-case, drop punctuation and English articles, collapse whitespace (the SQuAD convention)."""
    text = "".join(ch for ch in text.lower() if ch not in _PUNCT)
    return " ".join(_ARTICLES.sub(" ", text).split())


def exact_match(prediction: str, reference: str) -> float:
    return float(normalize_answer(prediction) == normalize_answer(reference))


def token_f1(prediction: str, reference: str) -> float:
    """Harmonic mean of token precision and recall after normalization (1.0 when both are empty)."""
    pred, ref = normalize_answer(prediction).split(), normalize_answer(reference).split()
    if not pred or not ref:
        return float(pred == ref)
    common = sum((Counter(pred) & Counter(ref)).values())
    if common == 0:
        return 0.0
    precision, recall = common / len(pred), common / len(ref)
    return 2 * precision * recall / (precision + recall)


def contains_answer(prediction: str, reference: str) -> bool:
    """The normalized reference occurs in the normalized prediction as a whole-word span."""
    ref = normalize_answer(reference)
    return bool(ref) and f" {ref} " in f" {normalize_answer(prediction)} "


class AnswerScores(Metric):
    """Exact match and token F1 in ``[0, 1]`` over (prediction, reference) strings; DDP-synchronized.

    A thin adapter over :class:`torchmetrics.text.SQuAD`, which keeps summed states that reduce
    across processes.
    """

    full_state_update = False

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.squad = SQuAD()

    def update(self, predictions: list[str], references: list[str]) -> None:
        if len(predictions) != len(references):
            raise ValueError(f"{len(predictions)} predictions for {len(references)} references")
        ids = [str(i) for i in range(len(predictions))]
        self.squad.update(
            [{"prediction_text": p, "id": i} for p, i in zip(predictions, ids)],
            [{"answers": {"answer_start": [0], "text": [r]}, "id": i} for r, i in zip(references, ids)],
        )

    def compute(self) -> dict[str, torch.Tensor]:
        scores = self.squad.compute()
        return {"em": scores["exact_match"] / 100.0, "f1": scores["f1"] / 100.0}

    def reset(self) -> None:
        super().reset()
        self.squad.reset()
