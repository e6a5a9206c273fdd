"""Text dropout: training samples whose prompt text sometimes keeps only its top units.

With the full working memory in the prompt the graph tokens are not needed: the text already holds the
evidence. Text dropout makes them needed on part of the training samples: with probability ``p`` a
sample's text keeps only its top ``m`` units, while the graph keeps all ``k``. Validation, test, export
and serving always use the product's prompt; only the training split goes through this.
"""

from __future__ import annotations

import random
from typing import Any, Sequence

from qgmem.errors import SettingError
from qgmem.prompting.contract import first_entries


class TextDropout:
    """A training split whose items' ``memory_text``, with probability ``p``, keeps only the top ``m`` entries.

    The draw of each read is seeded by ``seed``, the item's index and how often this object has read it,
    so a run repeats (per data-loader worker: each worker counts its own reads; a resumed run counts
    from zero again). The wrapped split is read lazily, item by item.
    """

    def __init__(self, items: Sequence[dict[str, Any]], p: float, m: int, seed: int = 0):
        self.check(p, m)
        self.items, self.p, self.m, self.seed = items, p, m, seed
        self.reads = [0] * len(items)
        self.dropped = 0

    @staticmethod
    def check(p: float, m: int) -> None:
        """Refuse a rate outside [0, 1] or a negative unit count, naming the data module's setting."""
        if not 0.0 <= p <= 1.0:
            raise SettingError(f"data.text_dropout must be a probability in [0, 1], got {p}")
        if m < 0:
            raise SettingError(f"data.text_dropout_units must be >= 0, got {m}")

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, index: int) -> dict[str, Any]:
        index = int(index)
        item = self.items[index]
        self.reads[index] += 1
        if random.Random(f"{self.seed}|{index}|{self.reads[index]}").random() >= self.p:
            return item
        self.dropped += 1
        return {**item, "memory_text": first_entries(item["memory_text"], self.m)}

    @property
    def share(self) -> float | None:
        """The share of reads whose text was cut (``None`` before any read)."""
        total = sum(self.reads)
        return self.dropped / total if total else None


__all__ = ["TextDropout"]
