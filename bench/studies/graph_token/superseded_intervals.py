"""Which published learning-check intervals were computed for the wrong design, and what their seeds say.

Until issue 44, ``hierarchical_bootstrap`` drew the questions independently inside each drawn seed (the
nested draw) although every seed scores the same questions (a crossed design): the question variance
was divided by the number of seeds. The per-question scores of those runs are gone, so their crossed
intervals cannot be recomputed here; what the JSON still holds is each seed's own interval (one seed,
a bootstrap over dialogues: right for that seed). This script lists every pooled multi-seed interval
beside its seeds' intervals (mean width, how many contain 0) and, with ``--mark``, writes a note into
each file saying that its pooled intervals are superseded::

    python -m bench.studies.graph_token.superseded_intervals docs/results/learning_check_*.json --mark

Single-run intervals (the untrained probe) have one seed, where both designs agree: they stand.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any, Iterator

NOTE = ("Pooled multi-seed intervals in this file were computed with the nested draw on crossed data (every "
        "seed scores the same questions): the question variance was divided by the number of seeds, so they "
        "are too narrow and superseded. Per-seed intervals stand. See docs/graph_token.md.")


def pooled(doc: Any, path: str = "") -> Iterator[tuple[str, dict[str, Any], list[dict[str, Any]]]]:
    """``(path, pooled result, per-seed results)`` for every multi-seed contrast in a learning-check JSON."""
    if not isinstance(doc, dict):
        return
    per_seed_rows = doc.get("per_seed") if isinstance(doc.get("per_seed"), list) else None
    for key, value in doc.items():
        if key in ("probe", "per_category", "per_seed"):
            continue
        if isinstance(value, dict) and isinstance(value.get("ci95"), list) and value.get("mean") is not None:
            seeds = []
            if isinstance(value.get("per_seed"), list):  # compare_models / lora_contrast: inside the entry
                seeds = [s for s in value["per_seed"] if isinstance(s, dict) and "ci95" in s]
            elif per_seed_rows:  # learning_check's brief: a per-seed row of every contrast beside them
                seeds = [row[key] for row in per_seed_rows if isinstance(row.get(key), dict)]
            if len(seeds) > 1:
                yield f"{path}.{key}".lstrip("."), value, seeds
        elif isinstance(value, dict):
            yield from pooled(value, f"{path}.{key}")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("files", nargs="+")
    p.add_argument("--mark", action="store_true", help="write the superseded note into each file with a pooled interval")
    args = p.parse_args(argv)
    rows = []
    print("| file | contrast | pooled mean [95 % CI], nested draw (superseded) | pooled width | mean per-seed width "
          "| per-seed intervals containing 0 |\n| --- | --- | --- | --- | --- | --- |")
    for name in args.files:
        path = Path(name)
        doc = json.loads(path.read_text())
        found = list(pooled(doc))
        for where, value, seeds in found:
            lo, hi = value["ci95"]
            widths = [s["ci95"][1] - s["ci95"][0] for s in seeds]
            zero = sum(s["ci95"][0] <= 0 <= s["ci95"][1] for s in seeds)
            row = {"file": path.name, "contrast": where, "mean": value["mean"], "ci95": [lo, hi], "width": hi - lo,
                   "per_seed_width": sum(widths) / len(widths), "per_seed_containing_0": zero, "seeds": len(seeds)}
            rows.append(row)
            print(f"| {path.name} | {where} | {value['mean']:+.3f} [{lo:+.3f}, {hi:+.3f}] | {hi - lo:.3f} | "
                  f"{row['per_seed_width']:.3f} | {zero} of {len(seeds)} |")
        if args.mark and found:
            doc = {"interval_design_note": NOTE, **{k: v for k, v in doc.items() if k != "interval_design_note"}}
            path.write_text(json.dumps(doc) + "\n")
    print(json.dumps({"pooled_intervals": len(rows)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
