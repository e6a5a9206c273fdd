"""Node-word alignment: node tokens fitted to the LM's word embeddings of the node texts (the default's stage).

Pre-training: ``steps`` Adam steps of :func:`qgmem.model.alignment.alignment_loss` before answer training,
no LM forward pass (:func:`qgmem.training.alignment.align_node_tokens`). Term: the same loss times
``weight`` in every training step, which keeps node tokens readable as words while the answer loss trains.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Sequence

import torch

from qgmem.training.stages.base import AnswerLogits, Stage


@dataclass
class NodeWordAlignment(Stage):
    """Fit each node's token to the LM's mean word embedding of the node's text.

    Args:
        steps: Pre-training steps before answer training (0 = the term only); on 2 CPU cores 0.2–0.3 s a
            step (the graph encoder and projector, no LM).
        batch_size: Graphs per pre-training step.
        lr: Adam learning rate of the pre-training steps.
        weight: Weight of the alignment loss added to the answer loss in every training step (0 = the
            pre-training steps only).
    """

    trains: ClassVar[str] = "the graph encoder and projector: node tokens towards the LM's word embeddings"
    term_name: ClassVar[str] = "align"

    steps: int = 300
    batch_size: int = 32
    lr: float = 3e-3
    weight: float = 5.0

    def check(self) -> None:
        if self.steps < 0 or not self.weight >= 0:
            self.refuse(f"steps ({self.steps}) and weight ({self.weight}) must be >= 0")
        if self.steps == 0 and self.weight == 0:
            self.refuse("steps and weight are both 0, so the stage does nothing: leave it out of the list")
        if self.batch_size < 1 or not self.lr > 0:
            self.refuse(f"batch_size must be >= 1 and lr > 0, got {self.batch_size} and {self.lr}")

    @property
    def pretrains(self) -> bool:
        return self.steps > 0

    @property
    def adds_term(self) -> bool:
        return self.weight > 0

    def pretrain(self, module: Any, dataset: Sequence[dict[str, Any]], graphs: Any, *, seed: int,
                 progress: bool = False) -> dict[str, float]:
        from qgmem.training.alignment import align_node_tokens

        return align_node_tokens(module.net, dataset, graphs, module.lm.get_input_embeddings().weight,
                                 steps=self.steps, batch_size=self.batch_size, lr=self.lr, seed=seed,
                                 device=module.device, progress=progress)

    def term(self, module: Any, batch: dict[str, Any], answer: AnswerLogits | None) -> torch.Tensor | None:
        from qgmem.model.alignment import alignment_loss

        ids = getattr(batch["graph"], "node_word_ids", None)
        if ids is None:  # samples without node texts: nothing to align
            return None
        return alignment_loss(module.net.node_tokens(batch["graph"]), ids, module.lm.get_input_embeddings().weight)
