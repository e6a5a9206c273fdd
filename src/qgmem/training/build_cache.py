"""``qgmem build-cache``: build a run's training cache outside training, whole or one slice at a time.

The configuration is the one ``qgmem fit`` reads, through the same parser (LightningCLI's, with
``--config`` and ``--print_config``; the ``default`` preset when no ``--config`` is given): its
``data`` section, with ``model.lm`` linked into ``data.lm`` by the same link as in training, fixes the
cache key, so the cache built here is the one ``fit`` then reuses. Only the data module is built (no
LM is loaded). Any data setting is a flag (``--data.num_cases 20``). Three ways to run it::

    qgmem build-cache --config default                          # the whole cache, one process
    qgmem build-cache --config run.yaml --shard 3/16            # one slice (a job array's task) ...
    qgmem build-cache --config run.yaml                         # ... then one run merges and filters
    torchrun --nproc_per_node 8 -m qgmem.training.build_cache --config run.yaml --shard auto

``--shard auto`` takes the ranks of torchrun or SLURM through Lightning Fabric (gloo on CPU): every
rank builds its slice, rank 0 merges and filters, all wait for the dataset.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

from qgmem.errors import UserError, run_command, split_debug

PROG = "qgmem build-cache"
DESCRIPTION = __doc__.splitlines()[0].replace("``", "")


def add_build_arguments(parser) -> None:
    """The build's own flags, beside the training configuration's."""
    parser.add_argument("--shard", type=str | None, default=None,
                        help="I/N: build only the cases of slice I of N (0-based); 'auto': one slice per "
                             "rank of torchrun or SLURM, then rank 0 merges and filters")
    parser.add_argument("--rebuild", action="store_true", help="rewrite the filtered dataset (shards are kept)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bars")


def _cache_cli():
    from qgmem.training.cli import QGMemCLI

    class CacheCLI(QGMemCLI):
        """The training parser (links included) plus the build's flags; it builds the data module only."""

        def add_arguments_to_parser(self, parser) -> None:
            super().add_arguments_to_parser(parser)
            add_build_arguments(parser)

        def instantiate_classes(self) -> None:
            self.datamodule = _data_module(self.config["data"])

    return CacheCLI


def _data_module(data):
    """The :class:`~qgmem.training.datamodule.QGMemDataModule` of a parsed ``data`` section."""
    from jsonargparse import ArgumentParser

    from qgmem.training.datamodule import QGMemDataModule

    parser = ArgumentParser(exit_on_error=False)
    parser.add_class_arguments(QGMemDataModule, "data", fail_untyped=False)
    values = data.as_dict() if hasattr(data, "as_dict") else dict(data)
    try:
        return parser.instantiate(parser.parse_object({"data": values})).data
    except Exception as exc:  # jsonargparse names the offending key
        raise UserError(f"data: {exc}") from exc


def parse(argv: list[str]):
    """``(cli, build flags)`` for ``argv`` (``--config FILE|PRESET``, data flags, ``--shard`` ...)."""
    import warnings

    from qgmem.training.cli import DEFAULT_PRESET, with_config
    from qgmem.training.datamodule import QGMemDataModule
    from qgmem.training.module import QGMemModule

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="LightningCLI's args parameter")
        cli = _cache_cli()(QGMemModule, QGMemDataModule, run=False, args=with_config(argv, DEFAULT_PRESET),
                           seed_everything_default=0, auto_configure_optimizers=False,
                           parser_kwargs={"prog": PROG, "description": DESCRIPTION})
    return cli, cli.config


def data_module(argv: list[str]):
    """The data module ``qgmem build-cache ARGV`` would build from (e.g. ``["--config", "run.yaml"]``)."""
    return parse(argv)[0].datamodule


def _fabric():
    """Lightning Fabric over the ranks torchrun or SLURM started (CPU, gloo), launched; and the ranks per node."""
    from lightning.fabric import Fabric
    from lightning.fabric.plugins.environments import SLURMEnvironment, TorchElasticEnvironment

    if TorchElasticEnvironment.detect():
        local = int(os.environ["LOCAL_WORLD_SIZE"])
    elif SLURMEnvironment.detect():
        local = int(os.environ.get("SLURM_NTASKS_PER_NODE", "1").split("(")[0])
    else:
        raise UserError("--shard auto needs the ranks of torchrun or SLURM (srun); none found: give --shard I/N")
    world = int(os.environ.get("WORLD_SIZE") or os.environ.get("SLURM_NTASKS") or local)
    fabric = Fabric(accelerator="cpu", strategy="ddp", devices=local, num_nodes=max(1, world // local))
    fabric.launch()
    return fabric, local


def build_with_fabric(spec, per_node: bool, rebuild: bool, progress: bool) -> tuple[dict[str, Any] | None, bool]:
    """Build over the launched ranks; returns rank 0's summary (or ``None``) and whether this is global rank 0."""
    import torch

    from qgmem.samples.build import build_on_ranks

    fabric, local = _fabric()
    rank, world = ((fabric.local_rank, local) if per_node
                   else (fabric.global_rank, fabric.world_size))

    def any_rank(flag: bool) -> bool:
        return bool(fabric.all_reduce(torch.tensor(float(flag)), reduce_op="sum").item() > 0)

    summary = build_on_ranks(spec, rank, world, any_rank=any_rank, rebuild=rebuild, progress=progress)
    return summary, fabric.global_rank == 0


def run(argv: list[str]) -> int:
    """``qgmem build-cache ARGV``: parse (``--help`` and ``--print_config`` exit here), then build."""
    from qgmem.samples import cache as C
    from qgmem.samples.build import Shard, build_cache

    try:
        cli, args = parse(argv)
    except SystemExit as exc:  # --help, --print_config (0) or a bad flag (2, the parser said why)
        return int(exc.code or 0)
    dm = cli.datamodule
    spec, progress = dm.cache_spec, not args.no_progress
    if args.shard == "auto":
        summary, main_rank = build_with_fabric(spec, dm.prepare_data_per_node, args.rebuild, progress)
        if not main_rank:  # one JSON line per run: concurrent ranks' prints would interleave on one line
            return 0
        out = {"dataset_dir": str(spec.dataset_dir), "complete": C.DatasetCache(spec.dataset_dir).complete,
               **({"samples": summary["samples"]} if summary else {})}
    elif args.shard is not None:
        try:
            shard = Shard.parse(args.shard)
        except ValueError as exc:
            raise UserError(f"--shard: {exc}") from exc
        out = build_cache(spec, shard=shard, progress=progress)
        out = {"samples_dir": str(spec.samples_dir), **{k: out.get(k) for k in ("complete", "planned", "present",
                                                                                  "built", "shard") if k in out}}
    elif C.DatasetCache(spec.dataset_dir).complete and not args.rebuild:
        out = {"dataset_dir": str(spec.dataset_dir), "complete": True, "reused": True}
    else:
        summary = build_cache(spec, progress=progress)
        out = {"dataset_dir": str(spec.dataset_dir), "complete": True, "samples": summary["samples"]}
    print(json.dumps(out, sort_keys=True))
    return 0


def main(argv: list[str] | None = None) -> int:
    """Entry point for ``python -m qgmem.training.build_cache`` (what torchrun launches): ``qgmem build-cache``."""
    argv, debug = split_debug(sys.argv[1:] if argv is None else argv)
    return run_command(PROG, run, argv, debug)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
