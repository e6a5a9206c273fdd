from __future__ import annotations

import math

import pytest
import torch
from torchmetrics.functional.retrieval import retrieval_recall

from qgmem.evaluation.metrics import evidence_metrics, mean_metrics, percentiles

L2 = math.log2


@pytest.mark.parametrize(
    ("entries", "gold", "k", "recall", "precision", "ndcg"),
    [
        # repeated evidence at rank 4 earns nDCG only for the new gold turn it adds
        ([["t5"], ["t1"], ["t9"], ["t1", "t2"]], {"t1", "t2"}, 4, 1.0, 0.5,
         (1 / L2(3) + 1 / L2(5)) / (1 + 1 / L2(3))),
        ([], {"t1"}, 10, 0.0, 0.0, 0.0),
        ([["t1", "t2"]], {"t1", "t2"}, 10, 1.0, 0.1, 1.0),  # one entry grounding both is ideal
        ([["t3"], ["t4"], ["t3"]], {"t3"}, 1, 1.0, 1.0, 1.0),  # cut at k = 1
        ([["t1"], ["t7"]], {"t1", "t2", "t3"}, 2, 1 / 3, 0.5, 1 / (1 + 1 / L2(3))),
        ([["t8"], ["t9"], ["t2"]], {"t2"}, 2, 0.0, 0.0, 0.0),  # hit below the cutoff does not count
    ],
)
def test_known_answers(entries, gold, k, recall, precision, ndcg):
    m = evidence_metrics(entries, gold, k)
    assert m == pytest.approx({"recall": recall, "precision": precision, "ndcg": ndcg}, abs=1e-6)


@pytest.mark.parametrize("k", [1, 2, 3, 5])
def test_recall_matches_torchmetrics_for_single_turn_entries(k):
    ranked = ["a", "b", "c", "d", "e"]
    gold = {"b", "e", "z"}
    corpus = ranked + ["z"]  # a gold turn never retrieved ranks last
    preds = torch.tensor([float(len(corpus) - i) for i in range(len(ranked))] + [-1.0])
    target = torch.tensor([t in gold for t in corpus])
    expected = float(retrieval_recall(preds, target, top_k=k))
    assert evidence_metrics([[t] for t in ranked], gold, k)["recall"] == pytest.approx(expected)


def test_invalid_inputs_and_aggregation():
    with pytest.raises(ValueError, match="gold evidence"):
        evidence_metrics([["t1"]], [], 10)
    with pytest.raises(ValueError, match="k must"):
        evidence_metrics([["t1"]], ["t1"], 0)
    rows = [{"recall": 1.0, "precision": 0.2, "ndcg": 1.0}, {"recall": 0.0, "precision": 0.0, "ndcg": 0.0}]
    assert mean_metrics(rows, 10) == {"recall@10": 0.5, "precision@10": 0.1, "ndcg@10": 0.5}
    assert mean_metrics([], 5) == {"recall@5": 0.0, "precision@5": 0.0, "ndcg@5": 0.0}
    assert percentiles([1.0, 2.0, 3.0, 4.0]) == {50: 2.5, 95: pytest.approx(3.85)}
