"""Retrieval quality against gold evidence turns.

A retrieved entry (a memory unit, or a raw turn for the baseline) stands for the turns of its source
span. Per question, with the top ``k`` entries:

- **Recall@k**: the fraction of gold evidence turns covered by some entry's span.
- **Precision@k**: the fraction of the ``k`` slots holding an entry whose span touches gold evidence
  (an empty slot counts as a miss, as in torchmetrics with a fixed ``top_k``).
- **nDCG@k**: binary gain for an entry that covers a gold turn no higher-ranked entry covered; gold turns
  that no entry covers count as relevant items ranked below ``k``. So repeating the same evidence earns
  nothing, and one entry grounding two gold turns is as good as the ideal ranking.

Precision and nDCG are computed by torchmetrics' retrieval functions on that relevance vector.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np
import torch
from torchmetrics.functional.retrieval import retrieval_normalized_dcg, retrieval_precision


def evidence_metrics(entries: Sequence[Sequence[str]], gold: Iterable[str], k: int) -> dict[str, float]:
    """``{"recall", "precision", "ndcg"}`` of one question's ranked entries (each a list of turn ids)."""
    gold = set(gold)
    if not gold:
        raise ValueError("evidence metrics need at least one gold evidence turn")
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    top = [set(e) for e in entries[:k]]
    covered: set[str] = set()
    touches, novel = [], []
    for span in top:
        hit = span & gold
        touches.append(bool(hit))
        novel.append(bool(hit - covered))
        covered |= hit
    missing = len(gold - covered)
    # Empty slots up to k are non-relevant, so uncovered gold turns always rank below the cutoff.
    slots = novel + [False] * (k - len(novel))
    preds = torch.tensor([float(k - i) for i in range(k)] + [-1.0] * missing)
    ndcg = float(retrieval_normalized_dcg(preds, torch.tensor(slots + [True] * missing), top_k=k))
    touched = torch.tensor(touches + [False] * (k - len(touches)))
    precision = float(retrieval_precision(preds[:k], touched, top_k=k))
    return {"recall": len(covered) / len(gold), "precision": precision, "ndcg": ndcg}


def covered_recall(entries: Sequence[Sequence[str]], gold: Iterable[str]) -> float:
    """Share of the gold turns that some entry's span covers (all entries, no cutoff)."""
    gold = set(gold)
    if not gold:
        raise ValueError("recall needs at least one gold evidence turn")
    covered: set[str] = set()
    for entry in entries:
        covered.update(gold.intersection(entry))
    return len(covered) / len(gold)


def gold_ranks(entries: Sequence[Sequence[str]], gold: Iterable[str]) -> dict[str, int | None]:
    """Gold turn -> 1-based position of the first entry covering it (None: no entry does)."""
    ranks: dict[str, int | None] = {tid: None for tid in sorted(set(gold))}
    for position, entry in enumerate(entries, start=1):
        for tid in entry:
            if tid in ranks and ranks[tid] is None:
                ranks[tid] = position
    return ranks


def mean_metrics(rows: Sequence[dict[str, float]], k: int) -> dict[str, float]:
    """Average per-question metrics into ``recall@k``, ``precision@k``, ``ndcg@k`` (fractions in [0, 1])."""
    if not rows:
        return {f"recall@{k}": 0.0, f"precision@{k}": 0.0, f"ndcg@{k}": 0.0}
    return {f"{name}@{k}": float(np.mean([r[name] for r in rows])) for name in ("recall", "precision", "ndcg")}


def percentiles(values: Sequence[float], qs: Sequence[float] = (50, 95)) -> dict[int, float]:
    """Selected percentiles (linear interpolation); zeros when there are no values."""
    if not values:
        return {int(q): 0.0 for q in qs}
    return {int(q): float(np.percentile(np.asarray(values, dtype=np.float64), q)) for q in qs}
