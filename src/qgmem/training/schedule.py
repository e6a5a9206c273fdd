"""The learning-rate schedule of the default run, as a class ``--lr_scheduler`` can name.

Linear warm-up, then a cosine decay to ``min_lr_rate`` of the peak rate at the run's last step (the
``cosine_with_min_lr`` schedule of ``transformers``, which a test compares it with). The run's length
is known only once the trainer exists, so ``total_steps`` is filled in by the module when it is not
given; any other ``torch.optim.lr_scheduler`` class works through ``--lr_scheduler`` as well.
"""

from __future__ import annotations

import math

from torch.optim import Optimizer
from torch.optim.lr_scheduler import LambdaLR


class WarmupCosine(LambdaLR):
    """Linear warm-up over ``warmup_steps``, then cosine decay to ``min_lr_rate`` × the peak rate.

    Args:
        optimizer: The optimizer whose rates it sets (given by the module).
        warmup_steps: Steps of linear warm-up from 0 (at most the run's steps - 1).
        min_lr_rate: The final rate as a fraction of the peak rate.
        total_steps: The run's optimizer steps (``None``: the module gives the trainer's estimate).
        last_epoch: The index of the last step (``-1`` = start).
    """

    def __init__(self, optimizer: Optimizer, warmup_steps: int = 20, min_lr_rate: float = 0.1,
                 total_steps: int | None = None, last_epoch: int = -1):
        if warmup_steps < 0 or not 0.0 <= min_lr_rate <= 1.0:
            raise ValueError(f"warmup_steps must be >= 0 and min_lr_rate in [0, 1], got {warmup_steps}, {min_lr_rate}")
        total = max(1, int(total_steps or 1))
        warmup = min(int(warmup_steps), max(0, total - 1))
        self.warmup_steps, self.min_lr_rate, self.total_steps = warmup, float(min_lr_rate), total

        def factor(step: int) -> float:
            if step < warmup:
                return step / max(1, warmup)
            progress = (step - warmup) / max(1, total - warmup)
            cosine = 0.5 * (1.0 + math.cos(math.pi * progress))
            return max(0.0, cosine * (1.0 - self.min_lr_rate) + self.min_lr_rate)

        super().__init__(optimizer, factor, last_epoch=last_epoch)
