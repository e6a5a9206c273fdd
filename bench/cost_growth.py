"""Cost growth: cache-build seconds per case against dialogue length, and the graph encoder against k.

1. The same cases replayed (construction + activation, the embedded default, no embedding memo so the
   encoder's cost is counted) with 0, 1, 2 and 4 distractor conversations: seconds against turns.
2. Real working-memory graphs of those cases at ``activation.k`` = 5, 10, 20, 50 (memo on: only the
   graphs matter here), batched 4 at a time through the graph encoder + projector, forward and
   backward: milliseconds per batch against nodes per graph.

Writes one PNG per curve (``--out``, default docs/) and prints one JSON object last.

    python bench/cost_growth.py --cases 2
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import time
from pathlib import Path


def replay_seconds(spec, cases: int) -> list[dict]:
    from qgmem.training.cache_build import Replayer, plan_cases

    plan, _ = plan_cases(spec)
    replayer = Replayer(spec, memo=False)
    out = []
    for split, case in plan[:cases]:
        start = time.perf_counter()
        rows = replayer.rows(split, case)
        out.append({"case": case.id, "turns": case.dialogue.num_turns(), "qas": len(rows),
                    "seconds": time.perf_counter() - start})
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-path", default="data/convomem")
    parser.add_argument("--cases", type=int, default=2)
    parser.add_argument("--distractors", default="0,1,2,4")
    parser.add_argument("--ks", default="5,10,20,50")
    parser.add_argument("--cache-dir", default="/tmp/qgmem-cost-growth")
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
    from qgmem.training import cache as C
    from qgmem.training.cache_build import Replayer, plan_cases
    from qgmem.training.cache_spec import CacheSpec

    base = CacheSpec(data_path=args.data_path, cache_dir=Path(args.cache_dir), answer_filter="none",
                     construction=ConstructionConfig(), num_cases=args.cases)
    build = []
    for d in (int(x) for x in args.distractors.split(",")):
        for row in replay_seconds(dataclasses.replace(base, distractor_conversations=d), args.cases):
            build.append({**row, "distractors": d})
            print(f"replay: {d} distractors, {row['turns']} turns, {row['seconds']:.2f} s", flush=True)

    net = GraphTokenNet(GraphTokenConfig(feature_dim=base.feature_dim, edge_dim=base.feature_dim, lm_hidden=576))
    encoder = []
    for k in (int(x) for x in args.ks.split(",")):
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
    fig, ax = plt.subplots(figsize=(5, 3.5))
    ax.plot([r["turns"] for r in build], [r["seconds"] for r in build], "o")
    ax.set(xlabel="dialogue turns (case + distractors)", ylabel="seconds per case (replay, no memo)",
           title="Cache build: construction + activation per case")
    fig.tight_layout()
    fig.savefig(out / "cost_cache_build.png", dpi=120)
    fig, ax = plt.subplots(figsize=(5, 3.5))
    ax.plot([r["nodes_per_graph"] for r in encoder], [r["ms_per_batch_of_4"] for r in encoder], "o-")
    for r in encoder:
        ax.annotate(f"k={r['k']}", (r["nodes_per_graph"], r["ms_per_batch_of_4"]))
    ax.set(xlabel="nodes per graph", ylabel="ms per batch of 4 (fwd + bwd)",
           title="Graph encoder + projector against graph size")
    fig.tight_layout()
    fig.savefig(out / "cost_graph_encoder.png", dpi=120)
    print(json.dumps({"cache_build": build, "graph_encoder": encoder, "threads": torch.get_num_threads()}))


if __name__ == "__main__":
    main()
