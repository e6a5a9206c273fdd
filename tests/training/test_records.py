"""Per-sample evaluation rows: one per sample, per-category means, NLL for all and EM/F1 for decoded rows."""

from __future__ import annotations

import pytest
import torch

from qgmem.training.records import EvalRecords, by_category


def a_batch(ids, categories, answers):
    return {"qa_id": ids, "category": categories, "question": [f"q{i}" for i in ids], "answer": answers}


def test_rows_keep_ids_nll_and_scores_of_decoded_batches():
    records = EvalRecords()
    records.add(a_batch(["a", "b"], ["x", "y"], ["Green", "red car"]), torch.tensor([1.0, 3.0]), ["green", "a red bus"])
    records.add(a_batch(["c"], ["x"], ["Blue"]), torch.tensor([2.0]), None)  # not decoded
    rows = records.gather()
    assert [r["qa_id"] for r in rows] == ["a", "b", "c"]
    assert rows[0] == {"qa_id": "a", "category": "x", "question": "qa", "answer": "Green", "nll": 1.0,
                       "prediction": "green", "em": 1.0, "f1": 1.0}
    assert rows[1]["em"] == 0.0 and rows[1]["f1"] == pytest.approx(0.5)  # "red" of {red, car} / {red, bus}
    assert "prediction" not in rows[2] and "em" not in rows[2]
    records.reset()
    assert records.gather() == []


def test_gather_keeps_a_repeated_sample_once():
    records = EvalRecords()
    records.add(a_batch(["a", "a"], ["x", "x"], ["A", "A"]), torch.tensor([1.0, 1.0]), None)  # sampler padding
    assert len(records.gather()) == 1


def test_by_category_means_nll_over_all_and_em_f1_over_decoded_rows():
    rows = [{"category": "x", "nll": 1.0, "em": 1.0, "f1": 1.0}, {"category": "x", "nll": 3.0},
            {"category": "y", "nll": 2.0, "em": 0.0, "f1": 0.25}, {"category": "", "nll": 4.0}]
    assert by_category(rows) == {"uncategorized": {"nll": 4.0}, "x": {"nll": 2.0, "em": 1.0, "f1": 1.0},
                                 "y": {"nll": 2.0, "em": 0.0, "f1": 0.25}}
