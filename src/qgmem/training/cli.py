"""Training commands: ``qgmem fit|validate|test`` (one stage each) and the CLI that ``python train.py``'s job parses with.

A ``LightningCLI`` over ``QGMemModule`` and ``QGMemDataModule``: every value is a YAML key and a flag
(``--trainer.devices 8``, ``--model.encoder.layers 3``, ``--data.num_cases 1200``), and ``--config``
takes a file or a preset's name (:mod:`qgmem.configs`). ``model.lm`` is the single source of the LM id
(linked into the data module); the sentence encoder's width is linked into the model once the data
module exists. The run's answer contract (the prompt with ``data.memory_units``, ``data.activation``,
``data.graph_mode``) is the data module's: the model adopts it in ``setup`` and records it in its
checkpoints, and the export copies it from there. ``python train.py`` (:mod:`qgmem.job`) runs cache → fit → best checkpoint → test → export; the
subcommands run one Lightning stage, so ``qgmem test --config default --ckpt_path …`` tests a checkpoint without
retraining (its hyperparameters come from the checkpoint). Everything a run writes lives under
``--trainer.default_root_dir``: TensorBoard logs, ``checkpoints/`` (best by ``val/nll`` + ``last.ckpt``),
``metrics.json``, ``test_predictions.jsonl`` and ``export/``.
"""

from __future__ import annotations

import os
import sys
import warnings
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.cli import LightningCLI

from qgmem.configs import resolve_config
from qgmem.older_records import TRAINING_FLAGS
from qgmem.settings_flags import add_retired_arguments
from qgmem.training.callbacks import default_callbacks
from qgmem.training.guard import FiniteModelCheckpoint, NonFiniteGuard
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
        _show_resolved_defaults(parser)
        if self.whole_job:
            parser.add_argument("--ckpt_path", type=str | None, default=None,
                                help="resume fit from this checkpoint ('last' = the run root's last.ckpt)")
        # accepted by the subcommands too, so one YAML (and a run's saved config.yaml) drives both
        only = "" if self.whole_job else " (train.py's whole job only; `qgmem fit` only fits)"
        parser.add_argument("--export", type=bool, default=True, help="export the best checkpoint at the end" + only)
        parser.add_argument("--run_test", type=bool, default=True, help="test the best checkpoint after fit" + only)
        add_retired_arguments(parser, TRAINING_FLAGS, dashes=False)  # an old YAML key or flag, refused by name

    def instantiate_classes(self) -> None:
        """Build the run's objects; a setting they refuse (a ``ValueError``) is a user error naming it."""
        from qgmem.errors import as_user_error

        with as_user_error(ValueError, prefix="bad setting: "):
            super().instantiate_classes()

    def _parse_ckpt_path(self) -> None:
        """A subcommand's ``--ckpt_path`` sets ``model`` from the checkpoint's hyperparameters (Lightning's
        rule), read as today's module takes them (:func:`qgmem.older_records.checkpoint_hparams`: an older
        checkpoint's flat stage and generation settings become its ``stages`` and ``generation``, its ``graph``
        its ``graph_mode``)."""
        from lightning.fabric.utilities.cloud_io import _load as pl_load

        from qgmem.older_records import checkpoint_hparams

        subcommand = self.config.get("subcommand")
        ckpt_path = self.config[subcommand].get("ckpt_path") if subcommand else None
        if not (ckpt_path and Path(ckpt_path).is_file()):
            return
        hparams = dict(pl_load(ckpt_path, map_location="cpu").get("hyper_parameters") or {})
        hparams.pop("_instantiator", None)
        if hparams:
            self.config = self.parser.parse_object({subcommand: {"model": checkpoint_hparams(hparams)}}, self.config)

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


def run_subcommand(args: list[str], datamodule_class: type | None = None) -> int:
    """``qgmem fit|validate|test [--config FILE|PRESET] ...``: one Lightning stage through its subcommand.

    Without ``--config`` the stage reads the ``default`` preset, so it resolves to the configuration
    ``python train.py`` runs.
    """
    if args and args[0] in SUBCOMMANDS:  # the default preset when no --config is given, as in train.py
        args = [args[0], *with_config(args[1:], DEFAULT_PRESET)]
    _cli(args, run=True, datamodule_class=datamodule_class)
    return 0
