"""Seconds per case of the cache build's replay (construction + activation), with and without the memo.

Side by side in one process, over the same planned cases (the embedded default: the real sample,
heuristic extractor, MiniLM):

- ``process_memo``: the encoder's own in-process memo only (what the build did before the disk memo);
- ``disk_memo_cold``: the per-text memo on disk, starting empty;
- ``disk_memo_warm``: a rebuild with another ``activation.k``, reading the memo the cold pass left.

Each pass also records every case's dialogue length (turns) and seconds, for the cost-growth curve
(``--plot docs/cache_build_cost.png`` fits and draws it). The last line is one JSON object.

    python bench/cache_build.py --num-cases 60
    python bench/cache_build.py --num-cases 60 --passes process_memo --plot docs/cache_build_cost.png
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
import time
from dataclasses import replace


def run_pass(spec, plan, memo: bool) -> dict:
    from qgmem.samples.build import Replayer

    replayer = Replayer(spec, memo=memo)
    replayer.encoder.encode(["warm-up"])  # model load and first-call setup are not per-case cost
    per_case = []
    started = time.perf_counter()
    for split, case in plan:
        t = time.perf_counter()
        replayer.rows(split, case)
        per_case.append((case.dialogue.num_turns(), time.perf_counter() - t))
    total = time.perf_counter() - started
    replayer.close()
    out = {"cases": len(plan), "total_s": round(total, 1), "s_per_case": round(total / max(1, len(plan)), 3),
           "per_case": [[n, round(s, 3)] for n, s in per_case]}
    if replayer.memo is not None:
        out["memo"] = replayer.memo.stats()
    else:
        out["encoded"] = int(getattr(replayer.encoder, "calls", 0))
    return out


def plot(per_case: list[list[float]], path: str, title: str) -> dict:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    turns = np.array([p[0] for p in per_case], dtype=float)
    secs = np.array([p[1] for p in per_case], dtype=float)
    slope, intercept = np.polyfit(turns, secs, 1)
    r = float(np.corrcoef(turns, secs)[0, 1]) if len(turns) > 2 else float("nan")
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.scatter(turns, secs, s=12, alpha=0.7, label="one case")
    xs = np.linspace(0, turns.max() * 1.05, 50)
    ax.plot(xs, slope * xs + intercept, color="C1",
            label=f"fit: {slope * 1e3:.1f} ms/turn + {intercept:.2f} s (r = {r:.2f})")
    ax.set_xlabel("dialogue length (turns)")
    ax.set_ylabel("replay seconds per case")
    ax.set_title(title)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    return {"ms_per_turn": round(slope * 1e3, 2), "intercept_s": round(intercept, 3), "r": round(r, 3)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-path", default="data/convomem")
    parser.add_argument("--num-cases", type=int, default=60, help="0: all cases")
    parser.add_argument("--distractors", type=int, default=None, help="default: the data module's")
    parser.add_argument("--passes", default="process_memo,disk_memo_cold,disk_memo_warm")
    parser.add_argument("--warm-k", type=int, default=5, help="activation.k of the warm rebuild")
    parser.add_argument("--plot", default=None, help="PNG of seconds per case against turns (first pass)")
    args = parser.parse_args()

    import torch

    from qgmem.samples.build import plan_cases
    from qgmem.samples.spec import CacheSpec

    cache_dir = tempfile.mkdtemp(prefix="qgmem-bench-build-")
    kwargs = {"data_path": args.data_path, "num_cases": args.num_cases or None, "cache_dir": cache_dir,
              "answer_filter": "none"}
    if args.distractors is not None:
        kwargs["distractor_conversations"] = args.distractors
    figures: dict = {"cpu_threads": torch.get_num_threads(), "load_avg_1m_start": round(os.getloadavg()[0], 2)}
    try:
        spec = CacheSpec(**kwargs)
        plan, _ = plan_cases(spec)
        figures["cases"] = len(plan)
        figures["turns_per_case"] = round(sum(c.dialogue.num_turns() for _, c in plan) / max(1, len(plan)), 1)
        for name in args.passes.split(","):
            if name == "disk_memo_warm":
                this = CacheSpec(**kwargs, activation=replace(spec.activation, k=args.warm_k))
            else:
                this = spec
            figures[name] = run_pass(this, plan, memo=name != "process_memo")
            print(f"{name:>16}: {figures[name]['s_per_case']} s/case over {len(plan)} cases "
                  f"({figures[name].get('memo') or figures[name].get('encoded')})", flush=True)
        first = figures[args.passes.split(",")[0]]
        if args.plot:
            figures["fit"] = plot(first["per_case"], args.plot,
                                  f"cache build replay, {len(plan)} cases (heuristic, MiniLM, 1 CPU thread)")
        for name in args.passes.split(","):
            figures[name].pop("per_case")
    finally:
        shutil.rmtree(cache_dir, ignore_errors=True)
    figures["load_avg_1m_end"] = round(os.getloadavg()[0], 2)
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
