"""Compare models scored by ``bench/studies/graph_token/learning_check.py``: mean answer NLL of one condition, and each
model's seed-paired difference to the lowest, with the crossed hierarchical interval (seeds, and the
dialogues once for all drawn seeds: every model and seed scores the same samples).

Seed ``s`` of one model and seed ``s`` of another saw the same training order (``data.order_seed``), so
their per-sample differences are paired. Used for the validation choice of the default::

    python -m bench.studies.graph_token.compare_models --setting text-graph --condition own \\
        summary_nodes=checkpoints/lc-val5/summary_nodes paper_token=checkpoints/lc-val5/paper_token \\
        node_tokens=checkpoints/lc-val5/node_tokens

Prints a markdown table and one JSON line.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

from qgmem.evaluation.bootstrap import hierarchical_bootstrap


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("models", nargs="+", help="NAME=ROOT: a learning_check --root per model")
    p.add_argument("--setting", default="text-graph", help="the learning_check setting folder under each root")
    p.add_argument("--condition", default="own")
    p.add_argument("--n-boot", type=int, default=10_000)
    return p.parse_args(argv)


def seed_scores(root: Path, setting: str, condition: str) -> dict[int, dict]:
    """``{seed: {"qa_id", "group", "nll"}}`` from the one spec folder under ``root/setting``."""
    specs = sorted(p for p in (root / setting).glob("*") if p.is_dir())
    if len(specs) != 1:
        raise SystemExit(f"{root / setting}: expected one spec folder, found {len(specs)}")
    out = {}
    for path in sorted(specs[0].glob("seed-*.json")):
        r = json.loads(path.read_text())
        s = r["scores"]
        out[int(r["seed"])] = {"qa_id": s["qa_id"], "group": s["group"],
                               "nll": [np.nan if v is None else v for v in s["nll"][condition]]}
    if not out:
        raise SystemExit(f"{specs[0]}: no finished seed")
    return out


def main(argv=None) -> int:
    args = parse_args(argv)
    models = {}
    for item in args.models:
        name, _, root = item.partition("=")
        if not root:
            raise SystemExit(f"{item!r}: expected NAME=ROOT")
        models[name] = seed_scores(Path(root), args.setting, args.condition)
    seeds = sorted(set.intersection(*(set(m) for m in models.values())))
    first = models[next(iter(models))][seeds[0]]
    for name, m in models.items():  # pairing needs the same samples in the same order
        for s in seeds:
            if m[s]["qa_id"] != first["qa_id"]:
                raise SystemExit(f"{name} seed {s}: scored other samples than {next(iter(models))}")
    table = {name: np.asarray([m[s]["nll"] for s in seeds]) for name, m in models.items()}
    mean = {name: float(np.nanmean(a)) for name, a in table.items()}
    best = min(mean, key=mean.get)
    result = {"condition": args.condition, "setting": args.setting, "seeds": seeds, "n": len(first["qa_id"]),
              "best": best, "models": {}}
    print(f"| model | {args.condition} NLL, mean of {len(seeds)} seeds | per seed | − {best} (95 % CI) |")
    print("| --- | --- | --- | --- |")
    for name, a in sorted(table.items(), key=lambda kv: mean[kv[0]]):
        per_seed = [float(np.nanmean(row)) for row in a]
        entry = {"mean": mean[name], "per_seed": per_seed}
        diff = "-"
        if name != best:
            d = hierarchical_bootstrap(a - table[best], first["group"], design="crossed", n_boot=args.n_boot)
            entry["minus_best"] = {"mean": d["mean"], "ci95": d["ci95"], "per_seed": d["per_seed"]}
            diff = f"{d['mean']:+.3f} [{d['ci95'][0]:+.3f}, {d['ci95'][1]:+.3f}]"
        result["models"][name] = entry
        print(f"| {name} | {mean[name]:.3f} | " + ", ".join(f"{x:.3f}" for x in per_seed) + f" | {diff} |")
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
