"""Time loading the ConvoMem sample into cases (history building + evidence mapping) and splitting it.

Usage: python -m bench.data.data_loading [--path data/convomem] [--repeats 5] [--distractors 6]
Prints one line per figure; the median of ``--repeats`` runs is reported.
"""

from __future__ import annotations

import argparse
import statistics
import time

from qgmem.data.loaders import load_cases
from qgmem.data.splits import split_cases

from bench.common import REPO as ROOT


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--path", default=str(ROOT / "data" / "convomem"))
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--distractors", type=int, default=6)
    args = parser.parse_args()

    load_s, split_s = [], []
    for _ in range(args.repeats):
        start = time.perf_counter()
        loaded = load_cases("convomem", args.path, distractor_conversations=args.distractors)
        load_s.append(time.perf_counter() - start)
        start = time.perf_counter()
        split_cases(loaded.cases, group_key="dialogue")
        split_s.append(time.perf_counter() - start)
    cases = loaded.cases
    turns = sum(c.dialogue.num_turns() for c in cases)
    ev = loaded.report["evidence"]
    print(f"files: {len(loaded.report['files_read'])}  cases: {len(cases)}  turns (all histories): {turns}")
    print(f"distractor conversations per case: {args.distractors}")
    print(f"load + build histories + map evidence: median {statistics.median(load_s):.3f} s "
          f"(min {min(load_s):.3f}, max {max(load_s):.3f}, {args.repeats} runs)")
    print(f"per case: {1000 * statistics.median(load_s) / len(cases):.2f} ms")
    print(f"split (by dialogue): median {1000 * statistics.median(split_s):.1f} ms")
    print(f"evidence spans: {ev['total']}  exact {ev['exact']}  contained {ev['contained']}  "
          f"fuzzy {ev['fuzzy']}  unmatched {ev['unmatched']}  "
          f"(mapped {100 * (ev['total'] - ev['unmatched']) / ev['total']:.1f} %)")


if __name__ == "__main__":
    main()
