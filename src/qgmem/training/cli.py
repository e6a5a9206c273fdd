"""Training commands: ``python train.py`` (the whole job) and ``qgmem fit|validate|test`` (one stage each).

A ``LightningCLI`` over ``QGMemModule`` and ``QGMemDataModule``: every value is a YAML key and a flag
(``--trainer.devices 8``, ``--model.encoder.layers 3``, ``--data.num_cases 1200``), and ``--config``
takes a file or a preset's name (:mod:`qgmem.configs`). ``model.lm`` is the single source of the LM id
(linked into the data module); the sentence encoder's width and the prompt contract
(``data.max_prompt_tokens``, ``data.enable_thinking``, ...) are linked into the model once the data
module exists. ``python train.py`` runs cache → fit → best checkpoint → test → export; the subcommands
run one Lightning stage, so ``qgmem test --config default --ckpt_path …`` tests a checkpoint without
retraining (its hyperparameters come from the checkpoint). Everything a run writes lives under
``--trainer.default_root_dir``: TensorBoard logs, ``checkpoints/`` (best by ``val/nll`` + ``last.ckpt``),
``metrics.json``, ``test_predictions.jsonl`` and ``export/``.
"""

from __future__ import annotations

import json
import os
import sys
import time
import warnings
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.cli import LightningCLI

from qgmem.configs import resolve_config
from qgmem.provenance import provenance
from qgmem.training.callbacks import PREDICTIONS_FILE, default_callbacks
from qgmem.training.guard import FiniteModelCheckpoint, NonFiniteError, NonFiniteGuard
from qgmem.training.module import DEFAULT_LR_SCHEDULER, DEFAULT_OPTIMIZER

DEFAULT_ROOT = "checkpoints"
DEFAULT_PRESET = "default"
SUBCOMMANDS = ("fit", "validate", "test")


def _checkpoint_dir(root: str | None) -> str:
    return os.path.join(root or DEFAULT_ROOT, "checkpoints")


class QGMemCLI(LightningCLI):
    """LightningCLI with the QGMem links, a checkpoint callback, default callbacks and the run's extra flags.

    ``run=False`` is ``train.py``'s whole job (its own ``--ckpt_path``); ``run=True`` gives the
    ``fit|validate|test`` subcommands, where ``--ckpt_path`` is the Lightning method's own argument.
    """

    def __init__(self, *args, run: bool = True, **kwargs) -> None:
        self.whole_job = not run  # read by add_arguments_to_parser, which LightningCLI.__init__ calls
        super().__init__(*args, run=run, **kwargs)

    def add_arguments_to_parser(self, parser) -> None:
        parser.add_lightning_class_args(FiniteModelCheckpoint, "checkpoint")  # never a NaN val/nll as best
        parser.add_lightning_class_args(NonFiniteGuard, "nonfinite")  # --nonfinite.action stop|skip
        parser.set_defaults({"checkpoint.monitor": "val/nll", "checkpoint.mode": "min", "checkpoint.save_last": True,
                             "checkpoint.save_top_k": 1, "checkpoint.auto_insert_metric_name": False,
                             "checkpoint.filename": "epoch{epoch:02d}-step{step:05d}-val_nll{val/nll:.4f}",
                             "trainer.default_root_dir": DEFAULT_ROOT})
        # fixed folder under the run root, so `--ckpt_path last` finds the previous run's last.ckpt
        parser.link_arguments("trainer.default_root_dir", "checkpoint.dirpath", compute_fn=_checkpoint_dir)
        # LightningCLI's --optimizer / --lr_scheduler (class_path + init_args), handed to the model, which
        # builds them over its trainable parameters and steps the schedule every optimizer step
        # (auto_configure_optimizers is off, so LightningCLI leaves configure_optimizers to the model)
        parser.add_optimizer_args((torch.optim.Optimizer,))
        parser.add_lr_scheduler_args((torch.optim.lr_scheduler.LRScheduler,))
        parser.set_defaults({"optimizer": DEFAULT_OPTIMIZER, "lr_scheduler": DEFAULT_LR_SCHEDULER})
        parser.link_arguments("optimizer", "model.optimizer", compute_fn=_class_spec)
        parser.link_arguments("lr_scheduler", "model.lr_scheduler", compute_fn=_class_spec)
        parser.link_arguments("model.lm", "data.lm")
        parser.link_arguments("data.feature_dim", "model.feature_dim", apply_on="instantiate")
        parser.link_arguments("data.prompt_settings", "model.prompt", apply_on="instantiate")
        _show_resolved_defaults(parser)
        if self.whole_job:
            parser.add_argument("--ckpt_path", type=str | None, default=None,
                                help="resume fit from this checkpoint ('last' = the run root's last.ckpt)")
        # accepted by the subcommands too, so one YAML (and a run's saved config.yaml) drives both
        only = "" if self.whole_job else " (train.py's whole job only; `qgmem fit` only fits)"
        parser.add_argument("--export", type=bool, default=True, help="export the best checkpoint at the end" + only)
        parser.add_argument("--run_test", type=bool, default=True, help="test the best checkpoint after fit" + only)

    def before_instantiate_classes(self) -> None:
        """A run given ``--ckpt_path`` takes the checkpoint's weights, so ``model.init_from`` is not read.

        (A saved ``config.yaml`` keeps the path the run started from; on another machine, or once that
        file is gone, the file need not exist to resume, validate or test.)
        """
        config = self.config.get(self.subcommand) if self.subcommand else self.config
        if config is not None and config.get("ckpt_path") and config.get("model.init_from"):
            print(f"--ckpt_path given: the weights come from the checkpoint, not from model.init_from "
                  f"{config.get('model.init_from')}", file=sys.stderr)
            config["model.init_from"] = None

    def _instantiate_trainer(self, config: dict[str, Any], callbacks: list[Callback]) -> Any:
        given = [*(config.get("callbacks") or []), *callbacks]
        return super()._instantiate_trainer(config, [*callbacks, *default_callbacks(config, given)])

    def after_fit(self) -> None:
        save_last(self.trainer)


def _class_spec(value: Any) -> dict[str, Any] | None:
    """A parsed ``--optimizer``/``--lr_scheduler`` as the plain ``{class_path, init_args}`` the model keeps."""
    as_dict = getattr(value, "as_dict", None)
    return as_dict() if callable(as_dict) else value


def _show_resolved_defaults(parser) -> None:
    """Construction and activation settings print as their values (``--print_config``), not ``null``."""
    from qgmem.activation.config import ActivationConfig
    from qgmem.memory.config import ConstructionConfig

    for key, value in (("data.construction", ConstructionConfig()), ("data.activation", ActivationConfig())):
        try:
            parser.get_default(key)
        except KeyError:  # a data module without the setting (tests' in-memory one)
            continue
        parser.set_defaults({key: value})


def save_last(trainer) -> None:
    """Write ``last.ckpt`` at the end of fit: steps after the last validation are not in it yet."""
    callback = trainer.checkpoint_callback
    if callback is not None and callback.save_last and callback.dirpath:
        trainer.save_checkpoint(os.path.join(callback.dirpath, "last.ckpt"))


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
        "graph": model.hparams.graph,
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
            from qgmem.export import export_checkpoint

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


def with_config(args: list[str], default_config: str | Path | None) -> list[str]:
    """``args`` with each ``--config``/``-c`` value resolved (a preset name → its file); ``default_config``
    is put first when none is given."""
    out: list[str] = []
    it = iter(args)
    for arg in it:
        if arg in ("-c", "--config"):
            value = next(it, None)
            out += [arg] if value is None else [arg, resolve_config(value)]
        elif arg.startswith("--config="):
            out.append("--config=" + resolve_config(arg.split("=", 1)[1]))
        else:
            out.append(arg)
    if default_config is not None and not any(a in ("-c", "--config") or a.startswith("--config=") for a in args):
        out = ["--config", resolve_config(str(default_config)), *out]
    return out


def _cli(args: list[str], run: bool, datamodule_class: type | None) -> QGMemCLI:
    from qgmem.training.module import QGMemModule

    if datamodule_class is None:
        from qgmem.training.datamodule import QGMemDataModule as datamodule_class
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="LightningCLI's args parameter")
        return QGMemCLI(QGMemModule, datamodule_class, run=run, args=args, save_config_kwargs={"overwrite": True},
                        seed_everything_default=0, auto_configure_optimizers=False)


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


def run_subcommand(args: list[str], datamodule_class: type | None = None) -> int:
    """``qgmem fit|validate|test [--config FILE|PRESET] ...``: one Lightning stage through its subcommand.

    Without ``--config`` the stage reads the ``default`` preset, so it resolves to the configuration
    ``python train.py`` runs.
    """
    if args and args[0] in SUBCOMMANDS:  # the default preset when no --config is given, as in train.py
        args = [args[0], *with_config(args[1:], DEFAULT_PRESET)]
    _cli(args, run=True, datamodule_class=datamodule_class)
    return 0
