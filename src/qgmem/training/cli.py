"""The training entry point (``python train.py``): cache → fit → best checkpoint → test → export.

A ``LightningCLI`` over ``QGMemModule`` and ``QGMemDataModule``: every value is a YAML key and a flag
(``--trainer.devices 8``, ``--model.encoder.layers 3``, ``--data.num_cases 1200``). ``model.lm`` is the
single source of the LM id (linked into the data module); the sentence encoder's width and the prompt
contract (``data.max_prompt_tokens``, ``data.enable_thinking``, ...) are linked into the model once the
data module exists. Everything a run writes lives under
``--trainer.default_root_dir``: TensorBoard logs, ``checkpoints/`` (best by ``val/nll`` + ``last.ckpt``),
``metrics.json`` and ``export/``.
"""

from __future__ import annotations

import json
import os
import sys
import warnings
from pathlib import Path
from typing import Any

from lightning.pytorch.callbacks import Callback, ModelCheckpoint
from lightning.pytorch.cli import LightningCLI

DEFAULT_ROOT = "checkpoints"


def _checkpoint_dir(root: str | None) -> str:
    return os.path.join(root or DEFAULT_ROOT, "checkpoints")


class QGMemCLI(LightningCLI):
    """LightningCLI with the QGMem links, a checkpoint callback and the run's extra flags."""

    def add_arguments_to_parser(self, parser) -> None:
        parser.add_lightning_class_args(ModelCheckpoint, "checkpoint")
        parser.set_defaults({"checkpoint.monitor": "val/nll", "checkpoint.mode": "min", "checkpoint.save_last": True,
                             "checkpoint.save_top_k": 1, "checkpoint.auto_insert_metric_name": False,
                             "checkpoint.filename": "epoch{epoch:02d}-step{step:05d}-val_nll{val/nll:.4f}",
                             "trainer.default_root_dir": DEFAULT_ROOT})
        # fixed folder under the run root, so `--ckpt_path last` finds the previous run's last.ckpt
        parser.link_arguments("trainer.default_root_dir", "checkpoint.dirpath", compute_fn=_checkpoint_dir)
        parser.link_arguments("model.lm", "data.lm")
        parser.link_arguments("data.feature_dim", "model.feature_dim", apply_on="instantiate")
        parser.link_arguments("data.prompt_settings", "model.prompt", apply_on="instantiate")
        parser.add_argument("--ckpt_path", type=str | None, default=None,
                            help="resume fit from this checkpoint ('last' = the run root's last.ckpt)")
        parser.add_argument("--export", type=bool, default=True, help="export the best checkpoint at the end")
        parser.add_argument("--run_test", type=bool, default=True, help="test the best checkpoint after fit")


class ValidationHistory(Callback):
    """Validation metrics by global step, so the best checkpoint's need no second validation pass."""

    def __init__(self) -> None:
        self.by_step: dict[int, dict[str, float]] = {}

    def on_validation_end(self, trainer, pl_module) -> None:
        if not trainer.sanity_checking:
            self.by_step[trainer.global_step] = {k: float(v) for k, v in trainer.callback_metrics.items()
                                                 if k.startswith("val/")}


def run_training(cli: QGMemCLI) -> dict[str, Any]:
    """Fit, re-validate and test the best checkpoint, write ``metrics.json``, export; return the metrics."""
    cfg = cli.config
    trainer, model, data = cli.trainer, cli.model, cli.datamodule
    root = Path(trainer.default_root_dir)
    history = ValidationHistory()
    trainer.callbacks.append(history)
    trainer.fit(model, datamodule=data, ckpt_path=cfg.get("ckpt_path"))
    callback = trainer.checkpoint_callback
    if callback is not None and callback.save_last and callback.dirpath:
        # steps after the last validation are not in last.ckpt yet; `--ckpt_path last` should continue from the end
        trainer.save_checkpoint(os.path.join(callback.dirpath, "last.ckpt"))
    best = callback.best_model_path if callback else ""
    which = "best" if best else None
    # checkpoints hold only tensors and plain hyperparameters, so they load with weights_only=True
    best_step = _checkpoint_step(best)
    if best_step in history.by_step:  # validated during this fit: reuse, saving a pass with generation
        val = [history.by_step[best_step]]
    else:
        val = trainer.validate(model, datamodule=data, ckpt_path=which, verbose=False, weights_only=True)
    test = (trainer.test(model, datamodule=data, ckpt_path=which, verbose=False, weights_only=True)
            if cfg.get("run_test", True) else [])
    metrics = {
        "val": _floats(val[0] if val else {}),
        "test": _floats(test[0] if test else {}),
        "best_checkpoint": best or None,
        "best_score": _float(trainer.checkpoint_callback.best_model_score) if best else None,
        "monitor": trainer.checkpoint_callback.monitor if trainer.checkpoint_callback else None,
        "graph": model.hparams.graph,
        "data": _jsonable(getattr(data, "summary", None)),
    }
    if trainer.is_global_zero:
        root.mkdir(parents=True, exist_ok=True)
        (root / "metrics.json").write_text(json.dumps(metrics, indent=2, default=str) + "\n")
        export_dir = None
        if cfg.get("export", True) and best:
            from qgmem.export import export_checkpoint

            export_dir = export_checkpoint(best, root / "export", metrics)
        log_dir = trainer.logger.log_dir if trainer.logger else None
        print(f"\nlogs (TensorBoard): {log_dir}\nbest checkpoint:    {best or '-'}\n"
              f"metrics:            {root / 'metrics.json'}\nexport:             {export_dir or '-'}")
        print("val:  " + json.dumps(metrics["val"]) + "\ntest: " + json.dumps(metrics["test"]))
        for line in data_summary_lines(metrics["data"] or {}):
            print(line)
    return metrics


def data_summary_lines(summary: dict[str, Any]) -> list[str]:
    """What the model was trained on, in a few lines: samples kept per split, filter, left-out categories."""
    lines = []
    totals = (summary.get("filter") or {}).get("totals") or {}
    if totals:
        kept = ", ".join(f"{name} {t.get('kept', 0)}/{t.get('samples', 0)}" for name, t in totals.items())
        lines.append(f"data:  samples kept (of built) {kept}; answer filter "
                     f"'{summary['filter'].get('rule', '?')}'; cache {summary.get('cache_key', '?')}")
    split = summary.get("split") or {}
    if split.get("group_key_used") and split.get("group_key_used") != split.get("group_key"):
        lines.append(f"data:  splits grouped by '{split['group_key_used']}' instead of '{split['group_key']}' "
                     "(too few groups; see metrics.json)")
    for category, why in ((summary.get("filter") or {}).get("left_out_categories") or {}).items():
        lines.append(f"data:  {category}: {why}")
    return lines


def _checkpoint_step(path: str) -> int | None:
    if not path:
        return None
    import torch

    return int(torch.load(path, map_location="cpu", weights_only=True)["global_step"])


def _float(value: Any) -> float | None:
    return None if value is None else float(value)


def _floats(d: dict[str, Any]) -> dict[str, float]:
    return {k: float(v) for k, v in d.items()}


def _jsonable(value: Any) -> Any:
    return json.loads(json.dumps(value, default=str)) if value is not None else None


def main(args: list[str] | None = None, default_config: str | Path | None = None,
         datamodule_class: type | None = None) -> dict[str, Any]:
    """Parse ``args`` (default: ``sys.argv``); ``default_config`` is used when no ``--config`` is given.

    ``datamodule_class`` replaces ``QGMemDataModule`` (tests use a small in-memory one).
    """
    from qgmem.training.module import QGMemModule

    if datamodule_class is None:
        from qgmem.training.datamodule import QGMemDataModule as datamodule_class
    args = list(sys.argv[1:] if args is None else args)
    if default_config is not None and not any(a in ("-c", "--config") or a.startswith("--config=") for a in args):
        args = ["--config", str(default_config), *args]
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="LightningCLI's args parameter")
        cli = QGMemCLI(QGMemModule, datamodule_class, run=False, args=args, save_config_kwargs={"overwrite": True},
                       seed_everything_default=0, auto_configure_optimizers=False)
    return run_training(cli)
