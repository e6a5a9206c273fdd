"""Plot the learning check's context-budget sweep: answer NLL against prompt tokens, one curve per condition.

Reads the JSON line ``bench/learning_check.py --protocol budget`` prints (saved to a file) and writes a
PNG plus the Markdown table that goes beside it::

    python bench/learning_check.py --protocol budget --memory-units 1 3 ... | tail -1 > budget.json
    python bench/plot_budget.py budget.json --out docs/learning_check_budget.png

Several files (runs of the sweep at other m) are merged into one curve, and the merged JSON line is
written with ``--merged FILE``. Each file must come from the same split, seeds and test samples.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

CONDITIONS = ("own", "ablated", "shuffled", "norel", "none")


def table(budget: dict) -> str:
    rows = ["| m | prompt text tokens | memory tokens | " + " | ".join(f"NLL {c}" for c in CONDITIONS)
            + " | own − none (95 % CI) | own − ablated (95 % CI) | own − shuffled (95 % CI) | target met |",
            "|" + " --- |" * (8 + len(CONDITIONS))]

    def ci(r):
        return "-" if not r or r.get("mean") is None else f"{r['mean']:+.3f} [{r['ci95'][0]:+.3f}, {r['ci95'][1]:+.3f}]"

    for m in sorted(budget, key=int):
        e = budget[m]
        nll = e["nll"]
        rows.append(f"| {m} | {e['prompt_tokens']:.0f} | {e['memory_tokens']:.0f} | "
                    + " | ".join("-" if nll.get(c) is None else f"{nll[c]:.3f}" for c in CONDITIONS) + " | "
                    + " | ".join(ci(e.get(k)) for k in ("own_vs_none", "own_vs_ablated", "own_vs_shuffled"))
                    + f" | {'-' if e.get('target_met') is None else 'yes' if e['target_met'] else 'no'} |")
    return "\n".join(rows)


def merge(results: list[dict]) -> dict:
    """One sweep from several runs: their ``budget`` entries side by side (an m given twice is refused)."""
    first, budget = dict(results[0]), {}
    for r in results:
        for key in ("split", "seed_list", "n_test"):
            if r[key] != first[key]:
                raise ValueError(f"the runs differ in {key}: {first[key]!r} and {r[key]!r}")
        for m, entry in r["budget"].items():
            if m in budget:
                raise ValueError(f"m = {m} is in two of the files")
            budget[m] = entry
    first["budget"] = budget
    first["budget_target_met"] = any(e.get("target_met") for m, e in budget.items() if m in ("1", "3"))
    first["wall_s"] = sum(r.get("wall_s", 0.0) for r in results)
    return first


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("results", nargs="+", help="files holding the learning check's JSON line")
    p.add_argument("--out", default="docs/learning_check_budget.png")
    p.add_argument("--merged", default=None, help="write the merged JSON line here")
    args = p.parse_args(argv)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    try:
        result = merge([json.loads(Path(f).read_text().strip().splitlines()[-1]) for f in args.results])
    except ValueError as e:
        p.error(str(e))
    if args.merged:
        Path(args.merged).write_text(json.dumps(result) + "\n")
    budget = result["budget"]
    ms = sorted(budget, key=int)
    fig, ax = plt.subplots(figsize=(6, 4))
    for condition in CONDITIONS:
        points = [(budget[m]["prompt_tokens"], budget[m]["nll"].get(condition), m) for m in ms]
        points = [q for q in points if q[1] is not None]
        if points:
            ax.plot([q[0] for q in points], [q[1] for q in points], marker="o", label=condition)
    for m in ms:
        ax.annotate(f"m={m}", (budget[m]["prompt_tokens"], budget[m]["nll"]["own"]), textcoords="offset points",
                    xytext=(4, 6), fontsize=8)
    ax.set_xlabel("prompt text tokens (mean; graph tokens not counted)")
    ax.set_ylabel("answer NLL (mean)")
    ax.set_title(f"Budget sweep, {result['split']} split, {result['seeds']} seeds, n={result['n_test']}")
    ax.legend()
    fig.tight_layout()
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(args.out, dpi=120)
    print(table(budget))
    return 0


if __name__ == "__main__":
    sys.exit(main())
