"""How many distinct source turns the activated units cover, from `qgmem eval-retrieval --out` files.

Several facts of one turn can fill several of the k working-memory slots; this reads the per-question
files (`--out`, or the ones `bench/activation_mechanisms.py` writes to its scratch folder) and prints,
per file, the mean number of activated units and of distinct source turns they cover.

    python bench/distinct_turns.py FILE.jsonl [FILE.jsonl ...]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def distinct_turns(path: Path) -> tuple[int, float, float]:
    """(questions, mean activated units, mean distinct source turns of those units) of one file."""
    rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    if not rows:
        return 0, 0.0, 0.0
    units = [len(r["activated"]) for r in rows]
    turns = [len({t for a in r["activated"] for t in a["source_turn_ids"]}) for r in rows]
    return len(rows), sum(units) / len(rows), sum(turns) / len(rows)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("files", nargs="+", type=Path)
    args = parser.parse_args()
    missing = [str(f) for f in args.files if not f.is_file()]
    if missing:
        print(f"error: no such file: {', '.join(missing)}", file=sys.stderr)
        return 2
    print("| file | questions | activated units | distinct source turns |")
    print("| --- | --- | --- | --- |")
    for path in args.files:
        n, units, turns = distinct_turns(path)
        print(f"| {path.name} | {n} | {units:.2f} | {turns:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
