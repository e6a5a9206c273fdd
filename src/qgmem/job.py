"""The whole training job, ``python train.py``: cache → fit → best checkpoint → test → export.

It sits above training and export (it calls both), beside the command line, so neither needs a floor
of its own: export reads a checkpoint with model code only, and training knows nothing of exports.
Everything a run writes lives under ``--trainer.default_root_dir`` (see :mod:`qgmem.training.cli`).
"""

from __future__ import annotations

import json
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

import torch
from lightning.pytorch.callbacks import Callback

from qgmem.export import export_checkpoint
from qgmem.provenance import provenance
from qgmem.training.callbacks import PREDICTIONS_FILE
from qgmem.training.cli import DEFAULT_PRESET, QGMemCLI, _cli, run_subcommand, save_last, with_config
from qgmem.training.guard import NonFiniteError, NonFiniteGuard


class ValidationHistory(Callback):
    """Validation metrics by global step, so the best checkpoint's need no second validation pass."""

    def __init__(self) -> None:
        self.by_step: dict[int, dict[str, float]] = {}

    def on_validation_end(self, trainer, pl_module) -> None:
        if not trainer.sanity_checking:
            self.by_step[trainer.global_step] = {k: float(v) for k, v in trainer.callback_metrics.items()
                                                 if k.startswith("val/")}


@contextmanager
def rng_kept() -> Iterator[None]:
    """Run a block, then put Python's, NumPy's and torch's random states back as they were.

    Why: the seed is set before the cache stage, and fit's data order and initial draws follow from it.
    A cache built in this process (which samples, shuffles and runs models) would otherwise leave the
    generators elsewhere than a cache that is only loaded, and the same command would give other figures.
    """
    import random

    import numpy as np

    python, numpy = random.getstate(), np.random.get_state()
    devices = [torch.cuda.current_device()] if torch.cuda.is_available() and torch.cuda.is_initialized() else []
    try:
        with torch.random.fork_rng(devices=devices):
            yield
    finally:
        random.setstate(python)
        np.random.set_state(numpy)


def run_training(cli: QGMemCLI) -> dict[str, Any]:
    """Fit, re-validate and test the best checkpoint, write ``metrics.json``, export; return the metrics."""
    cfg = cli.config
    trainer, model, data = cli.trainer, cli.model, cli.datamodule
    root = Path(trainer.default_root_dir)
    history = ValidationHistory()
    trainer.callbacks.append(history)
    seconds: dict[str, float] = {}
    started = time.perf_counter()
    if trainer.world_size <= 1 and hasattr(data, "prepare_data"):  # the cache stage, timed on its own
        with rng_kept():  # a build that draws does not move fit's draws: built or loaded, the same run
            data.prepare_data()
    seconds["cache"] = time.perf_counter() - started
    started = time.perf_counter()
    trainer.fit(model, datamodule=data, ckpt_path=cfg.get("ckpt_path"))
    seconds["alignment"] = float(getattr(model, "alignment_seconds", 0.0))
    seconds["fit"] = time.perf_counter() - started - seconds["alignment"]
    save_last(trainer)  # so `--ckpt_path last` continues from the end
    callback = trainer.checkpoint_callback
    best = callback.best_model_path if callback else ""
    rejected = getattr(callback, "rejected", [])
    if not best and rejected:
        raise NonFiniteError(f"every validation gave a non-finite {callback.monitor} (steps "
                             f"{[r['step'] for r in rejected]}): no checkpoint can be selected or exported")
    which = "best" if best else None
    # checkpoints hold only tensors and plain hyperparameters, so they load with weights_only=True
    best_step = _checkpoint_step(best)
    if best_step in history.by_step:  # validated during this fit: reuse, saving a pass with generation
        val = [history.by_step[best_step]]
    else:
        val = trainer.validate(model, datamodule=data, ckpt_path=which, verbose=False, weights_only=True)
    started = time.perf_counter()
    test = (trainer.test(model, datamodule=data, ckpt_path=which, verbose=False, weights_only=True)
            if cfg.get("run_test", True) else [])
    seconds["test"] = time.perf_counter() - started
    metrics = {
        "val": _floats(val[0] if val else {}),
        "test": _floats(test[0] if test else {}),
        "best_checkpoint": best or None,
        "best_score": _float(trainer.checkpoint_callback.best_model_score) if best else None,
        "monitor": trainer.checkpoint_callback.monitor if trainer.checkpoint_callback else None,
        "graph_mode": model.hparams.graph_mode,
        "data": _jsonable(getattr(data, "summary", None)),
        "nonfinite": _nonfinite_report(trainer),
        **provenance(),
    }
    if trainer.is_global_zero:
        root.mkdir(parents=True, exist_ok=True)
        (root / "metrics.json").write_text(json.dumps(metrics, indent=2, default=str) + "\n")
        export_dir = None
        started = time.perf_counter()
        if cfg.get("export", True) and best:
            export_dir = export_checkpoint(best, root / "export", metrics)
        seconds["export"] = time.perf_counter() - started
        metrics["seconds"] = {k: round(v, 1) for k, v in seconds.items()}
        (root / "metrics.json").write_text(json.dumps(metrics, indent=2, default=str) + "\n")
        log_dir = trainer.logger.log_dir if trainer.logger else None
        predictions = root / PREDICTIONS_FILE if test else None
        print(f"\nlogs (TensorBoard): {log_dir}\nbest checkpoint:    {best or '-'}\n"
              f"metrics:            {root / 'metrics.json'}\npredictions:        {predictions or '-'}\n"
              f"export:             {export_dir or '-'}")
        print("time:  " + ", ".join(f"{k} {v:.0f} s" for k, v in metrics["seconds"].items())
              + " (fit includes validation and re-validation; cache 0 s when it was reused)")
        for line in metric_lines(metrics["val"], metrics["test"]):
            print(line)
        for line in data_summary_lines(metrics["data"] or {}):
            print(line)
    return metrics


def metric_lines(val: dict[str, float], test: dict[str, float]) -> list[str]:
    """``val:``/``test:`` with the overall metrics, then one line per test category (all are in metrics.json)."""
    def overall(d: dict[str, float]) -> str:
        return json.dumps({k: v for k, v in d.items() if k.count("/") == 1})

    lines = [f"val:  {overall(val)}", f"test: {overall(test)}"]
    categories = sorted({k.split("/")[1] for k in test if k.count("/") == 2})
    for category in categories:
        scores = "  ".join(f"{m} {test[f'test/{category}/{m}']:.3f}" for m in ("nll", "em", "f1")
                           if f"test/{category}/{m}" in test)
        lines.append(f"test/{category}: {scores}")
    return lines


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


def _nonfinite_report(trainer) -> dict[str, Any]:
    """Skipped training steps and validations kept out of the top-k, for ``metrics.json``."""
    guard = next((c for c in trainer.callbacks if isinstance(c, NonFiniteGuard)), None)
    callback = trainer.checkpoint_callback
    return {"action": guard.action if guard else None, "skipped_steps": list(guard.skipped) if guard else [],
            "rejected_validations": list(getattr(callback, "rejected", []))}


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


def main(args: list[str] | None = None, default_config: str | Path | None = DEFAULT_PRESET,
         datamodule_class: type | None = None) -> dict[str, Any]:
    """``python train.py``: parse ``args`` (default: ``sys.argv``) and run the whole job.

    ``default_config`` (a file or preset name) is used when no ``--config`` is given;
    ``datamodule_class`` replaces ``QGMemDataModule`` (tests use a small in-memory one).
    """
    args = with_config(list(sys.argv[1:] if args is None else args), default_config)
    return run_training(_cli(args, run=False, datamodule_class=datamodule_class))


def resolved_config(args: list[str] | None = None, default_config: str | Path | None = DEFAULT_PRESET,
                    subcommand: str | None = None) -> dict[str, Any]:
    """The configuration a run would use (``--print_config``'s, as data), without building anything.

    ``subcommand`` (``fit``, ``validate``, ``test``) resolves that stage's instead of ``train.py``'s job;
    ``default_config=None`` gives the signature defaults alone.
    """
    import contextlib
    import io

    import yaml

    args = [*(args or []), "--print_config"]
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        try:
            if subcommand is None:
                main(args, default_config=default_config)
            else:
                run_subcommand([subcommand, *args])
        except SystemExit as exc:
            if exc.code not in (0, None):
                raise
    return yaml.safe_load(out.getvalue())


def script_main(argv: list[str] | None = None, default_config: str | Path | None = DEFAULT_PRESET) -> int:
    """``train.py``'s entry point: :func:`main` under the user-error convention of the ``qgmem`` command.

    A user error (bad config, non-finite loss, damaged cache) prints one message and exits 2;
    ``--debug`` shows the traceback.
    """
    from qgmem.errors import run_command, split_debug

    argv, debug = split_debug(sys.argv[1:] if argv is None else argv)

    def job(args: list[str]) -> int:
        main(args, default_config=default_config)
        return 0

    return run_command("train.py", job, argv, debug)
