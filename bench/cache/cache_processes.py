"""The default cache build from scratch on 1 and on 2 processes (``data.cache_processes``), side by side.

Each run is the real command, ``qgmem build-cache --config CONFIG --data.cache_processes P``, into a
fresh folder (no embedding memo, no shards), the process counts taking turns over ``--rounds``
rounds. Wall seconds are the command's, model loading and the plan included. The datasets are then
compared with the first count's, and with ``--rounds`` above 1 each count's later rounds with its
own first (is the same command reproducible?): the same samples in the same order with the same texts
and edges, and the largest absolute difference of any node or edge feature (vectors first encoded in
other batches differ in the last float32 bits).

    python -m bench.cache.cache_processes                      # configs/default.yaml, P = 1,2, 1 round
    python -m bench.cache.cache_processes --compare A/dataset-KEY B/dataset-KEY   # two built caches, no build
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter

FLOAT_COLUMNS = ("x", "edge_attr", "edge_fact")


def build(config: str, processes: int, folder: str) -> dict:
    command = [sys.executable, "-m", "qgmem.training.build_cache", "--config", config, "--no-progress",
               "--data.cache_dir", folder, "--data.cache_processes", str(processes)]
    t0 = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    summary_path = next(p for p in os.scandir(folder) if p.name.startswith("dataset-")).path
    summary = json.load(open(os.path.join(summary_path, "summary.json"), encoding="utf-8"))
    return {"wall_s": round(wall, 1), "replay_s": summary["seconds"]["replay_s"],
            "embedding_memo": summary["seconds"].get("embedding_memo"), "dataset": summary_path,
            "cache_key": summary["cache_key"]}


def compare(left: str, right: str) -> dict:
    import numpy as np

    from qgmem.samples import cache as C

    a, b = C.DatasetCache(left).load(), C.DatasetCache(right).load()
    worst, differing, fields = 0.0, 0, Counter()  # fields: column -> samples where it differs
    for split in C.SPLITS:
        if len(a[split]) != len(b[split]):
            return {"same_samples": False, "why": f"{split}: {len(a[split])} vs {len(b[split])} samples"}
        for x, y in zip(a[split], b[split]):
            changed = set()
            for key in x:
                if key in FLOAT_COLUMNS:
                    u, v = np.asarray(x[key] or [], np.float32), np.asarray(y[key] or [], np.float32)
                    if u.shape != v.shape:
                        changed.add(key)
                    elif u.size:
                        worst = max(worst, float(np.abs(u - v).max()))
                elif x[key] != y[key]:
                    changed.add(key)
            fields.update(changed)
            differing += bool(changed)
    return {"same_samples": not differing, "samples_differing": differing, "fields_differing": dict(fields),
            "max_abs_feature_diff": worst}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="default")
    parser.add_argument("--processes", default="1,2")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--compare", nargs=2, metavar="DATASET",
                        help="compare two dataset folders already built (two runs of train.py, say) and exit")
    args = parser.parse_args()
    if args.compare:
        print(json.dumps(compare(*args.compare)))
        return

    counts = [int(p) for p in args.processes.split(",")]
    root = tempfile.mkdtemp(prefix="qgmem-bench-processes-")
    runs: dict[int, list[dict]] = {p: [] for p in counts}
    try:
        for round_ in range(args.rounds):
            for p in counts:
                folder = os.path.join(root, f"p{p}-r{round_}")
                runs[p].append(build(args.config, p, folder))
                print(f"processes {p}, round {round_}: {runs[p][-1]['wall_s']} s wall", flush=True)
        first = counts[0]
        figures = {"config": args.config, "cores": os.cpu_count(), "rounds": args.rounds,
                   "wall_s": {p: [r["wall_s"] for r in rs] for p, rs in runs.items()},
                   "replay_s": {p: [r["replay_s"] for r in rs] for p, rs in runs.items()},
                   "embedding_memo": {p: rs[0]["embedding_memo"] for p, rs in runs.items()},
                   "same_cache_key": len({r["cache_key"] for rs in runs.values() for r in rs}) == 1,
                   "against_first": {p: compare(runs[first][0]["dataset"], rs[0]["dataset"])
                                     for p, rs in runs.items() if p != first},
                   # the same command again: is the build reproducible run to run?
                   "against_own_first_round": {p: [compare(rs[0]["dataset"], r["dataset"]) for r in rs[1:]]
                                               for p, rs in runs.items() if len(rs) > 1},
                   "load_avg_1m_end": round(os.getloadavg()[0], 2)}
        best = {p: min(r["wall_s"] for r in rs) for p, rs in runs.items()}
        figures["speedup_vs_first"] = {p: round(best[first] / best[p], 2) for p in counts}
    finally:
        shutil.rmtree(root, ignore_errors=True)
    for key, value in figures.items():
        print(f"{key:>18}: {value}")
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
