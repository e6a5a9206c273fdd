"""The studies' data modules: the product's, plus the settings that only a study sets.

The product trains on one prompt contract, in the order of its data seed, on the samples as cached.
The graph-token studies change exactly those, and nothing else:

- ``graph_only``: the textual working memory is left out of the prompts, so the graph tokens are the
  only evidence (the learning check's diagnostic setting);
- ``order_seed``: the seed of the training order and of the alignment stage's order, so the seeds of one
  protocol share one cache and differ in their order only;
- ``text_dropout`` / ``text_dropout_units``: with that probability a training sample's text keeps only its
  top units while the graph keeps all (:class:`~qgmem.evaluation.text_dropout.TextDropout`); validation
  and test read the full prompt. It did not win its comparison (docs/graph_token.md).

None of them is in any cache key: a study reads the product's cache.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from qgmem.evaluation.text_dropout import TextDropout
from qgmem.prompting import GRAPH_ONLY_SYSTEM_PROMPT, PromptSettings
from qgmem.training.datamodule import InMemoryDataModule, QGMemDataModule


class StudySettings:
    """The four study settings over a product data module (put first among the bases)."""

    def __init__(self, *args: Any, graph_only: bool = False, order_seed: int | None = None,
                 text_dropout: float = 0.0, text_dropout_units: int = 1, **kwargs: Any):
        TextDropout.check(text_dropout, text_dropout_units)
        self.graph_only, self._order_seed = graph_only, order_seed
        self.text_dropout, self.text_dropout_units = text_dropout, text_dropout_units
        super().__init__(*args, **kwargs)

    @property
    def prompt_settings(self) -> PromptSettings:
        settings = super().prompt_settings
        if not self.graph_only:
            return settings
        return replace(settings, include_memory_text=False, system_prompt=GRAPH_ONLY_SYSTEM_PROMPT)

    @property
    def order_seed(self) -> int:
        """``order_seed`` when set, else the product's (the data seed)."""
        return int(self._order_seed) if self._order_seed is not None else super().order_seed

    @order_seed.setter
    def order_seed(self, value: int | None) -> None:
        self._order_seed = value

    def _set_splits(self, splits: dict[str, Any]) -> None:
        super()._set_splits(splits)
        if self.text_dropout > 0:
            self._splits["train"] = TextDropout(self._splits["train"], self.text_dropout, self.text_dropout_units,
                                                seed=self.order_seed)


class StudyDataModule(StudySettings, QGMemDataModule):
    """:class:`~qgmem.training.datamodule.QGMemDataModule` (its cache, same keys) with the study settings."""


class InMemoryStudyDataModule(StudySettings, InMemoryDataModule):
    """:class:`~qgmem.training.datamodule.InMemoryDataModule` with the study settings (the cross-fit's units)."""


__all__ = ["InMemoryStudyDataModule", "StudyDataModule", "StudySettings"]
