"""Memory reconstruction: graph tokens the frozen LM reads back as the working-memory entries the text leaves out.

A pre-training phase only (the compact preset's stage 1): ``steps`` Adam steps in which the frozen LM
regenerates one hidden working-memory entry per graph from the graph tokens alone
(:func:`qgmem.training.reconstruction.reconstruct_memory`; an LM forward and backward pass a step).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Sequence

from qgmem.training.stages.base import Stage


@dataclass
class MemoryReconstruction(Stage):
    """Train the graph tokens to carry the memory entries the prompt's text leaves out.

    Args:
        steps: Pre-training steps before answer training (an LM forward and backward pass each).
        batch_size: Graphs (one entry each) per step.
        lr: Adam learning rate of the steps.
    """

    trains: ClassVar[str] = ("the graph encoder and projector: the frozen LM regenerates hidden memory entries "
                             "from the graph tokens")

    steps: int = 300
    batch_size: int = 32
    lr: float = 3e-3

    def check(self) -> None:
        if self.steps < 1 or self.batch_size < 1 or not self.lr > 0:
            self.refuse(f"steps and batch_size must be >= 1 and lr > 0, got {self.steps}, {self.batch_size} "
                        f"and {self.lr}")

    @property
    def pretrains(self) -> bool:
        return True

    def pretrain(self, module: Any, dataset: Sequence[dict[str, Any]], graphs: Any, *, seed: int,
                 progress: bool = False) -> dict[str, float]:
        from qgmem.training.reconstruction import reconstruct_memory

        return reconstruct_memory(module.net, module.lm, module.tokenizer, dataset, graphs,
                                  memory_units=module.prompt_encoder.settings.memory_units, steps=self.steps,
                                  batch_size=self.batch_size, lr=self.lr, seed=seed, device=module.device,
                                  progress=progress)
