"""``qgmem build-cache``: build a run's training cache outside training, whole or one slice at a time.

The config is the one ``qgmem fit`` reads (a file or a preset name): its ``data`` section, with
``model.lm`` linked to ``data.lm`` as in training, fixes the cache key, so the cache built here is
the one ``fit`` then reuses. Three ways to run it::

    qgmem build-cache --config default                          # the whole cache, one process
    qgmem build-cache --config run.yaml --shard 3/16            # one slice (a job array's task) ...
    qgmem build-cache --config run.yaml                         # ... then one run merges and filters
    torchrun --nproc_per_node 8 -m qgmem.training.build_cache --config run.yaml --shard auto

``--shard auto`` takes the ranks of torchrun or SLURM through Lightning Fabric (gloo on CPU): every
rank builds its slice, rank 0 merges and filters, all wait for the dataset. ``KEY=VALUE`` arguments
override the ``data`` section (dotted keys reach nested settings, values are YAML).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

from qgmem.errors import UserError, argparse_command, run_command, split_debug

PROG = "qgmem build-cache"
DESCRIPTION = __doc__.splitlines()[0].replace("``", "")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", "-c", required=True, help="config file or preset name (as for `qgmem fit`)")
    parser.add_argument("--shard", default=None,
                        help="I/N: build only the cases of slice I of N (0-based); 'auto': one slice per "
                             "rank of torchrun or SLURM, then rank 0 merges and filters")
    parser.add_argument("--rebuild", action="store_true", help="rewrite the filtered dataset (shards are kept)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bars")
    parser.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="data settings, e.g. num_cases=20")


def data_module(config: str, overrides: list[str] = ()):
    """The config's :class:`~qgmem.training.datamodule.QGMemDataModule` (its ``data`` section)."""
    import yaml
    from jsonargparse import ArgumentParser

    from qgmem.configs import resolve_config
    from qgmem.training.datamodule import QGMemDataModule

    path = Path(resolve_config(config))
    if not path.is_file():
        raise UserError(f"{path}: no such config file or preset")
    try:
        cfg = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except yaml.YAMLError as exc:
        raise UserError(f"{path}: not valid YAML: {exc}") from exc
    data = cfg.get("data") or {}
    if not isinstance(data, dict):
        raise UserError(f"{path}: data: expected a mapping, got {type(data).__name__}")
    data = dict(data.get("init_args", data))
    model_lm = (cfg.get("model") or {}).get("lm") if isinstance(cfg.get("model"), dict) else None
    if model_lm is not None:
        data["lm"] = model_lm  # training links model.lm to data.lm: the cache key must use the same LM
    for item in overrides:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise UserError(f"override {item!r}: expected KEY=VALUE (a data setting, e.g. num_cases=20)")
        target = data
        *parents, leaf = key.split(".")
        for part in parents:
            target = target.setdefault(part, {})
        target[leaf] = yaml.safe_load(value)
    parser = ArgumentParser(exit_on_error=False)
    parser.add_class_arguments(QGMemDataModule, "data", fail_untyped=False)
    try:
        return parser.instantiate(parser.parse_object({"data": data})).data
    except Exception as exc:  # jsonargparse names the offending key
        raise UserError(f"{path}: data: {exc}") from exc


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

    summary = build_on_ranks(spec, rank, world, barrier=fabric.barrier, any_rank=any_rank, rebuild=rebuild,
                             progress=progress)
    return summary, fabric.global_rank == 0


def run(args: argparse.Namespace) -> int:
    from qgmem.samples import cache as C
    from qgmem.samples.build import Shard, build_cache

    dm = data_module(args.config, args.overrides)
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
    return run_command(PROG, argparse_command(PROG, DESCRIPTION, add_arguments, run), argv, debug)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
