"""Callbacks every QGMem run gets: a step-based progress bar, ``hp_metric``, the LR monitor, test predictions.

``default_callbacks`` adds each one unless the configuration already holds one of its kind (or disabled
what it needs: no logger, no progress bar), so a YAML ``trainer.callbacks`` list can still replace them.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch.callbacks import Callback, LearningRateMonitor, ProgressBar, TQDMProgressBar

PREDICTIONS_FILE = "test_predictions.jsonl"


class StepProgressBar(TQDMProgressBar):
    """One training bar over optimizer steps, not batches per epoch.

    Runs are sized in steps (``max_steps``, ``max_epochs: -1``), so a per-epoch bar reads "Epoch 1/-2"
    and restarts each epoch; this one counts ``global_step`` to the run's total and names the epoch aside.
    """

    def on_train_start(self, trainer, pl_module) -> None:
        super().on_train_start(trainer, pl_module)
        total = trainer.estimated_stepping_batches
        self.train_progress_bar.total = None if math.isinf(total) else int(total)
        self.train_progress_bar.initial = 0
        self._show(trainer.global_step)

    def on_train_epoch_start(self, trainer, *_: Any) -> None:
        self.train_progress_bar.set_description(f"step (epoch {trainer.current_epoch})")

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx: int) -> None:
        step = trainer.global_step
        if self._should_update(step, self.train_progress_bar.total or 0):
            self._show(step)
            self.train_progress_bar.set_postfix(self.get_metrics(trainer, pl_module))

    def on_train_epoch_end(self, trainer, pl_module) -> None:
        if not self.train_progress_bar.disable:
            self.train_progress_bar.set_postfix(self.get_metrics(trainer, pl_module))

    def _show(self, step: int) -> None:
        if not self.train_progress_bar.disable:
            self.train_progress_bar.n = step
            self.train_progress_bar.refresh()


class HpMetric(Callback):
    """Logs ``hp_metric`` (TensorBoard's HPARAMS tab) as the checkpoint monitor's best value so far.

    Lightning logs a placeholder -1 at step 0 whenever a stage starts (fit, validate, test); this writes
    the best monitored value after every validation and again when a stage ends, so the last
    ``hp_metric`` of a run is the score of its best checkpoint.
    """

    def on_validation_end(self, trainer, pl_module) -> None:
        if not trainer.sanity_checking:
            self._log(trainer)

    def on_test_end(self, trainer, pl_module) -> None:
        self._log(trainer)

    @staticmethod
    def best(trainer) -> float | None:
        checkpoint = trainer.checkpoint_callback
        monitor = getattr(checkpoint, "monitor", None)
        if not monitor:
            return None
        values = [float(v) for v in (trainer.callback_metrics.get(monitor), checkpoint.best_model_score)
                  if v is not None and math.isfinite(float(v))]
        if not values:
            return None
        return min(values) if checkpoint.mode == "min" else max(values)

    def _log(self, trainer) -> None:
        value = self.best(trainer)
        if value is not None:
            for logger in trainer.loggers:
                logger.log_metrics({"hp_metric": value}, step=trainer.global_step)


class TestPredictionsWriter(Callback):
    """Writes the test set's per-sample records (question, reference, generation, EM, F1, NLL) as JSONL.

    The file goes next to ``metrics.json``, in ``trainer.default_root_dir``; the module gathers the
    records over processes, so only global rank 0 writes.
    """

    def __init__(self, filename: str = PREDICTIONS_FILE) -> None:
        self.filename = filename
        self.path: Path | None = None

    def on_test_end(self, trainer, pl_module) -> None:
        rows = getattr(pl_module, "test_predictions", None)
        if not rows or not trainer.is_global_zero:
            return
        self.path = Path(trainer.default_root_dir) / self.filename
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path, "w", encoding="utf-8") as f:
            for row in rows:
                f.write(json.dumps(row, ensure_ascii=False, default=_plain) + "\n")


def _plain(value: Any) -> Any:
    return value.item() if isinstance(value, torch.Tensor) else str(value)


def default_callbacks(trainer_config: dict[str, Any], given: list[Callback]) -> list[Callback]:
    """The callbacks above that ``trainer_config`` and the ``given`` callbacks leave room for."""
    extra: list[Callback] = []
    if trainer_config.get("enable_progress_bar") is not False and not any(isinstance(c, ProgressBar) for c in given):
        extra.append(StepProgressBar())
    logged = trainer_config.get("logger") not in (False, [])
    if logged and not any(isinstance(c, LearningRateMonitor) for c in given):
        extra.append(LearningRateMonitor(logging_interval="step"))
    for kind in (HpMetric, TestPredictionsWriter):
        if not any(isinstance(c, kind) for c in given):
            extra.append(kind())
    return extra
