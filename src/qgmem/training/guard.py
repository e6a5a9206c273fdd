"""Non-finite guard: a NaN or inf never trains the graph token, is never "best", never reaches an export.

One NaN in one node feature of one cached sample makes the loss NaN, the gradients NaN and, after one
optimizer step, every weight NaN; Lightning keeps going and selects a NaN checkpoint. Two callbacks
stop that:

- :class:`NonFiniteGuard` checks the loss (before backward) and the gradients (before the optimizer
  step) of every training step. A non-finite one is logged with the ``qa_id`` of every sample in the
  batch, then either stops the run (``action="stop"``, the default) or drops the step's gradients so
  the optimizer leaves the weights unchanged (``action="skip"``), counted, and the run stops once more
  than ``max_skipped`` steps were skipped. Under DDP the decision is reduced over ranks (any rank bad =
  every rank acts), so the ranks stay in step.
- :class:`FiniteModelCheckpoint` is ``ModelCheckpoint`` that never takes a non-finite monitored value
  (``val/nll`` NaN) into its top-k: Lightning otherwise files a NaN score as ``inf`` and, with no other
  checkpoint yet, selects it.
"""

from __future__ import annotations

import logging
from typing import Any, Literal

import torch
from lightning.pytorch.callbacks import Callback, ModelCheckpoint

from qgmem.errors import UserError
from qgmem.finite import nonfinite_names

log = logging.getLogger(__name__)

NonFiniteAction = Literal["stop", "skip"]
#: qa ids and parameter names shown in a message before it is cut with "..."
SHOWN = 8


class NonFiniteError(UserError, RuntimeError):
    """Training met a non-finite loss or gradient (stop), or skipped more steps than allowed (skip).

    A :class:`~qgmem.errors.UserError`: the cause is the input (a corrupt sample, a learning rate that
    diverges), and the message names the step, the samples and the settings that change the outcome.
    """


def _shown(names: list[str]) -> str:
    return ", ".join(names[:SHOWN]) + (f", ... ({len(names)} in all)" if len(names) > SHOWN else "")


class NonFiniteGuard(Callback):
    """Stop (default) or skip a training step whose loss or gradient is NaN/inf; log the batch's qa ids.

    Args:
        action: ``stop`` raises :class:`NonFiniteError` at the first bad step; ``skip`` drops that step's
            gradients (no weight or optimizer-state update) and counts it.
        max_skipped: with ``skip``, the run stops with :class:`NonFiniteError` when more steps than this
            were skipped (a few bad samples are tolerable; a diverged run is not).
        check_gradients: also check gradients (not only the loss). Skipped under a precision plugin with a
            gradient scaler (``16-mixed``), whose scaler already skips steps with inf gradients.
    """

    def __init__(self, action: NonFiniteAction = "stop", max_skipped: int = 10, check_gradients: bool = True):
        if action not in ("stop", "skip"):
            raise ValueError(f"nonfinite action must be 'stop' or 'skip', got {action!r}")
        if max_skipped < 0:
            raise ValueError(f"max_skipped must be >= 0, got {max_skipped}")
        self.action, self.max_skipped, self.check_gradients = action, int(max_skipped), check_gradients
        self.skipped: list[dict[str, Any]] = []  # one entry per skipped step (step, what, qa ids)
        self._qa_ids: list[str] = []
        self._loss: torch.Tensor | None = None

    # ---- hooks -----------------------------------------------------------------------------------
    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        ids = batch.get("qa_id", []) if isinstance(batch, dict) else []
        self._qa_ids = [str(i) for i in ids]
        self._loss = None

    def on_before_backward(self, trainer, pl_module, loss: torch.Tensor) -> None:
        self._loss = loss.detach()

    def on_before_optimizer_step(self, trainer, pl_module, optimizer) -> None:
        problems = []
        if self._loss is not None and not bool(torch.isfinite(self._loss).all()):
            problems.append(f"loss {self._loss.float().item()}")
        if self.check_gradients and getattr(trainer.precision_plugin, "scaler", None) is None:
            grads = {name: p.grad for name, p in pl_module.named_parameters() if p.grad is not None}
            bad = nonfinite_names(grads)
            if bad:
                problems.append(f"gradient of {_shown(bad)}")
        if not trainer.strategy.reduce_boolean_decision(bool(problems), all=False):
            return
        self._handle(trainer, optimizer, problems)

    # ---- a bad step --------------------------------------------------------------------------------
    def _handle(self, trainer, optimizer, problems: list[str]) -> None:
        what = "; ".join(problems) or "on another rank"
        where = f"step {trainer.global_step} (epoch {trainer.current_epoch})"
        ids = _shown(self._qa_ids) or "(the batch carries no qa_id)"
        log.error("non-finite training %s at %s; batch qa_ids: %s", what, where, ids)
        if self.action == "stop":
            raise NonFiniteError(
                f"non-finite training {what} at {where}; the batch's qa_ids: {ids}. Stopped so that no NaN "
                "weights are saved or exported. Check those samples' features (a corrupt cache: rebuild it), "
                "lower the learning rate, or set nonfinite.action=skip to skip such steps")
        self.skipped.append({"step": int(trainer.global_step), "epoch": int(trainer.current_epoch),
                             "what": what, "qa_ids": list(self._qa_ids)})
        if len(self.skipped) > self.max_skipped:
            raise NonFiniteError(
                f"{len(self.skipped)} training steps had a non-finite loss or gradient, more than "
                f"nonfinite.max_skipped={self.max_skipped}; the last at {where} ({what}; qa_ids: {ids})")
        for group in optimizer.param_groups:  # no gradient = no update (AdamW skips such parameters)
            for p in group["params"]:
                p.grad = None
        trainer.lightning_module.log("train/skipped_steps", float(len(self.skipped)), on_step=True, on_epoch=False,
                                     batch_size=max(1, len(self._qa_ids)))

    # ---- checkpoint state: the count survives a resume --------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return {"skipped": list(self.skipped)}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.skipped = list(state_dict.get("skipped", []))


class FiniteModelCheckpoint(ModelCheckpoint):
    """``ModelCheckpoint`` whose top-k (and so ``best_model_path``) never holds a non-finite score.

    ``last.ckpt`` is still written (resuming needs it); ``rejected`` counts the validations left out.
    """

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.rejected: list[dict[str, Any]] = []

    def check_monitor_top_k(self, trainer, current: torch.Tensor | None = None) -> bool:
        if current is not None and not bool(torch.isfinite(torch.as_tensor(current)).all()):
            self.rejected.append({"step": int(trainer.global_step), "value": float(current)})
            log.warning("%s is %s at step %d: this checkpoint cannot be the best one", self.monitor,
                        float(current), trainer.global_step)
            return False
        return super().check_monitor_top_k(trainer, current)

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "rejected": list(self.rejected)}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        super().load_state_dict(state_dict)
        self.rejected = list(state_dict.get("rejected", []))
