"""Per-sample evaluation records: what each validation/test sample scored, by category and over processes.

The module adds one row per sample (id, category, answer NLL and, for decoded batches, the generation
with its EM and F1); at epoch end the rows of every process are gathered, averaged per category for
TensorBoard, and the test rows become ``test_predictions.jsonl``.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import torch

from qgmem.text import exact_match, token_f1


class EvalRecords:
    """Rows of one evaluation epoch on this process; ``gather`` returns every process's rows."""

    def __init__(self) -> None:
        self.rows: list[dict[str, Any]] = []

    def add(self, batch: dict[str, Any], nll: torch.Tensor, predictions: list[str] | None) -> None:
        values = nll.detach().float().cpu().tolist()
        for i, value in enumerate(values):
            row = {"qa_id": batch["qa_id"][i], "category": batch["category"][i], "question": batch["question"][i],
                   "answer": batch["answer"][i], "nll": value}
            if predictions is not None:
                row.update(prediction=predictions[i], em=exact_match(predictions[i], batch["answer"][i]),
                           f1=token_f1(predictions[i], batch["answer"][i]))
            self.rows.append(row)

    def gather(self) -> list[dict[str, Any]]:
        """All processes' rows, each sample once (a collective under DDP: every rank must call it).

        A distributed sampler pads the last batches by repeating samples; repeats share a ``qa_id``.
        """
        parts = [self.rows]
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            parts = [None] * torch.distributed.get_world_size()
            torch.distributed.all_gather_object(parts, self.rows)
        seen: dict[str, dict[str, Any]] = {}
        for row in (row for part in parts for row in (part or [])):
            seen.setdefault(row["qa_id"], row)
        return list(seen.values())

    def reset(self) -> None:
        self.rows = []


def by_category(rows: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Mean ``nll`` over a category's rows and mean ``em``/``f1`` over its decoded rows."""
    groups: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for row in rows:
        groups[row["category"] or "uncategorized"].append(row)
    out: dict[str, dict[str, float]] = {}
    for category, members in sorted(groups.items()):
        scores = {"nll": sum(r["nll"] for r in members) / len(members)}
        decoded = [r for r in members if "em" in r]
        if decoded:
            scores["em"] = sum(r["em"] for r in decoded) / len(decoded)
            scores["f1"] = sum(r["f1"] for r in decoded) / len(decoded)
        out[category] = scores
    return out
