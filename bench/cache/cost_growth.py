"""Cost growth: cache-build seconds per case against dialogue length, and the graph encoder against k.

1. The first ``--cases`` planned cases replayed (construction + activation, the embedded default) with
   each of ``--distractors`` distractor conversations, ``--repeats`` times, the repeats interleaved so
   that a change in the machine's load spreads over every size. One replayer serves every replay (the
   models load once) and one untimed replay warms it up first. The encoder keeps no memo from one
   replay to the next (a case's own repeated texts are encoded once, as in a build), so every replay
   pays its full encoding. Per replay: wall seconds and CPU seconds of the process (all its threads,
   ``time.process_time``); the median over the repeats is kept, and a least-squares line of seconds
   against turns is fitted (slope, intercept, R²).
2. Real working-memory graphs of those cases at ``activation.k`` = 5, 10, 20, 50 (memo on: only the
   graphs matter here), batched 4 at a time through the graph encoder + projector, forward and
   backward: milliseconds per batch against nodes per graph.

Writes one PNG per curve (``--out``, default docs/) and prints one JSON object last.

    OMP_NUM_THREADS=1 python -m bench.cache.cost_growth --cases 3 --repeats 2 --parts build
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

from bench.common import MemoEncoder


def fit_line(xs: list[float], ys: list[float]) -> dict[str, float]:
    """Least squares ``y = slope·x + intercept`` and its R²."""
    slope, intercept = np.polyfit(np.asarray(xs, float), np.asarray(ys, float), 1)
    predicted = slope * np.asarray(xs) + intercept
    residual = float(np.sum((np.asarray(ys) - predicted) ** 2))
    total = float(np.sum((np.asarray(ys) - np.mean(ys)) ** 2))
    return {"slope_s_per_turn": float(slope), "intercept_s": float(intercept),
            "r2": 1.0 - residual / total if total > 0 else 1.0}


def replay_growth(base, cases: int, distractors: list[int], repeats: int) -> list[dict]:
    """Wall and CPU seconds of each case replayed at each distractor count (median over the repeats)."""
    from qgmem.embed import SentenceEncoder
    from qgmem.samples.build import DEFAULT_SENTENCE_ENCODER, Replayer, plan_cases

    name = None if base.sentence_encoder == DEFAULT_SENTENCE_ENCODER else base.sentence_encoder
    encoder = MemoEncoder(SentenceEncoder(name, max_cache_entries=0))
    replayer = Replayer(base, encoder, memo=False)
    plans = {d: plan_cases(dataclasses.replace(base, distractor_conversations=d))[0][:cases] for d in distractors}
    split, case = plans[distractors[0]][0]
    start = time.perf_counter()
    replayer.rows(split, case)  # warm-up: the parser's and the encoder's first calls, not timed
    print(f"warm-up replay: {time.perf_counter() - start:.2f} s", flush=True)
    times: dict[tuple[int, int], list[tuple[float, float]]] = {}
    for repeat in range(repeats):
        for d in distractors:
            for i, (split, case) in enumerate(plans[d]):
                encoder.reset()
                wall, cpu = time.perf_counter(), time.process_time()
                replayer.rows(split, case)
                wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
                times.setdefault((d, i), []).append((wall, cpu))
                print(f"replay {repeat}: {d} distractors, case {i}, {case.dialogue.num_turns()} turns, "
                      f"{wall:.2f} s wall, {cpu:.2f} s CPU", flush=True)
    replayer.close()
    out = []
    for (d, i), runs in sorted(times.items()):
        case = plans[d][i][1]
        out.append({"distractors": d, "case": case.id, "turns": case.dialogue.num_turns(),
                    "wall_s": statistics.median(w for w, _ in runs), "cpu_s": statistics.median(c for _, c in runs),
                    "repeats": len(runs)})
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-path", default="data/convomem")
    parser.add_argument("--cases", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--distractors", default="0,1,2,4,6")
    parser.add_argument("--parts", default="build,encoder", help="build, encoder or both (comma-separated)")
    parser.add_argument("--ks", default="5,10,20,50")
    parser.add_argument("--cache-dir", default=str(Path(tempfile.gettempdir()) / "qgmem-cost-growth"),
                        help="scratch cache folder (default: under the system's temporary directory)")
    parser.add_argument("--out", default="docs")
    args = parser.parse_args()

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import torch
    from torch_geometric.data import Batch

    from qgmem.activation.config import ActivationConfig
    from qgmem.memory.config import ConstructionConfig
    from qgmem.model.graph_token import GraphTokenConfig, GraphTokenNet
    from qgmem.samples import cache as C
    from qgmem.samples.build import Replayer, plan_cases
    from qgmem.samples.spec import CacheSpec

    base = CacheSpec(data_path=args.data_path, cache_dir=Path(args.cache_dir), answer_filter="none",
                     construction=ConstructionConfig(), num_cases=args.cases)
    parts = set(args.parts.split(","))
    build, fits = [], {}
    if "build" in parts:
        build = replay_growth(base, args.cases, [int(x) for x in args.distractors.split(",")], args.repeats)
        fits = {kind: fit_line([r["turns"] for r in build], [r[f"{kind}_s"] for r in build]) for kind in ("cpu", "wall")}
        print("| distractor conversations | case | turns | CPU s per case | wall s per case | CPU s per 100 turns |")
        print("| --- | --- | --- | --- | --- | --- |")
        for r in build:
            print(f"| {r['distractors']} | {r['case']} | {r['turns']} | {r['cpu_s']:.2f} | {r['wall_s']:.2f} | "
                  f"{100 * r['cpu_s'] / r['turns']:.2f} |")
        print("fit:", json.dumps(fits), flush=True)

    net = GraphTokenNet(GraphTokenConfig(feature_dim=base.feature_dim, edge_dim=base.feature_dim, lm_hidden=576,
                                         features="text", readout="mean", num_graph_tokens=1))
    encoder = []
    for k in (int(x) for x in args.ks.split(",") if "encoder" in parts):
        spec = dataclasses.replace(base, activation=ActivationConfig(k=k, pool_size=max(100, k)))
        plan, _ = plan_cases(spec)
        replayer = Replayer(spec)
        graphs = [C.row_to_data(r) for split, case in plan[:args.cases] for r in replayer.rows(split, case)]
        replayer.close()
        batch = Batch.from_data_list((graphs * 4)[:4])
        times = []
        for i in range(6):
            start = time.perf_counter()
            net(batch).sum().backward()
            net.zero_grad(set_to_none=True)
            if i:
                times.append(time.perf_counter() - start)
        nodes = statistics.mean(g.num_nodes for g in graphs)
        encoder.append({"k": k, "nodes_per_graph": nodes, "edges_per_graph": statistics.mean(g.num_edges for g in graphs),
                        "ms_per_batch_of_4": 1000 * statistics.median(times)})
        print(f"encoder: k={k}, {nodes:.1f} nodes/graph, {encoder[-1]['ms_per_batch_of_4']:.1f} ms per batch of 4",
              flush=True)

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if build:
        fig, ax = plt.subplots(figsize=(5.5, 3.8))
        turns = np.array([r["turns"] for r in build], float)
        line = np.linspace(0, turns.max() * 1.05, 50)
        for kind, marker, label in (("cpu", "o", "CPU s"), ("wall", "x", "wall s")):
            fit = fits[kind]
            ax.plot(turns, [r[f"{kind}_s"] for r in build], marker, label=f"{label} (median of {args.repeats})")
            ax.plot(line, fit["slope_s_per_turn"] * line + fit["intercept_s"], "--", linewidth=1,
                    label=f"fit {label}: {100 * fit['slope_s_per_turn']:.2f} s/100 turns, R² {fit['r2']:.2f}")
        ax.set(xlabel="dialogue turns (case + distractors)", ylabel="seconds per case (replay)",
               title="Cache build: construction + activation per case", xlim=(0, None), ylim=(0, None))
        ax.legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(out / "cost_cache_build.png", dpi=120)
    if not encoder:
        print(json.dumps({"cache_build": build, "fit": fits, "threads": torch.get_num_threads(),
                          "load_avg_1m": round(os.getloadavg()[0], 2)}))
        return
    fig, ax = plt.subplots(figsize=(5, 3.5))
    ax.plot([r["nodes_per_graph"] for r in encoder], [r["ms_per_batch_of_4"] for r in encoder], "o-")
    for r in encoder:
        ax.annotate(f"k={r['k']}", (r["nodes_per_graph"], r["ms_per_batch_of_4"]))
    ax.set(xlabel="nodes per graph", ylabel="ms per batch of 4 (fwd + bwd)",
           title="Graph encoder + projector against graph size")
    fig.tight_layout()
    fig.savefig(out / "cost_graph_encoder.png", dpi=120)
    print(json.dumps({"cache_build": build, "fit": fits, "graph_encoder": encoder, "threads": torch.get_num_threads(),
                      "load_avg_1m": round(os.getloadavg()[0], 2)}))


if __name__ == "__main__":
    main()
