"""What construction does with each sentence, per speaker role, on ConvoMem validation and the fixture.

Every sentence of a window's new turns gets one outcome (``SENTENCE_OUTCOMES``): ``read`` gave a
unit; the others say why none came. ``unread`` are content sentences that passed every filter but that
the clause reader could not read: the part of the recall ceiling that better reading would win back.
Only the rule stage runs (no parse, no embedding), so this takes seconds.

    python -m bench.construction.sentence_outcomes [--sets convomem_val locomo_form] [--json]

The sentences of a fallback unit (a turn that gave no other unit) are counted as ``fallback``: what the
rules alone leave out is ``unread`` plus ``fallback``.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter

from bench.common import REPO as ROOT

FIXTURE = ROOT / "tests" / "activation" / "fixtures" / "locomo_form.json"


def outcomes(cases, config) -> tuple[Counter, Counter]:
    """``"role/outcome" -> sentences`` and ``"role/kind" -> new turns`` over every window of every case.

    A turn's kind: ``units`` (it gives at least one), ``unread_only`` (none, but it holds an unread
    content sentence: what the fallback grounds) or ``nothing``.
    """
    from qgmem.memory.extract_heuristic import HeuristicExtractor, new_turns
    from qgmem.memory.windows import make_windows

    extractor = HeuristicExtractor(config)
    counts: Counter = Counter()
    turns: Counter = Counter()
    for case in cases:
        for window in make_windows(case.dialogue, config.window_size, config.window_overlap):
            names = frozenset(t.speaker for t in window.turns)
            for turn, previous, listener in new_turns(window):
                mine: Counter = Counter()
                claims = extractor.sentence_claims(turn, listener, previous, names, mine)
                counts.update(mine)
                role = turn.role.lower() or "unknown"
                kind = "units" if claims else "unread_only" if mine.get(f"{role}/unread") else "nothing"
                turns[f"{role}/{kind}"] += 1
    return counts, turns


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sets", nargs="+", default=["convomem_val", "locomo_form"],
                        choices=["convomem_val", "locomo_form"])
    parser.add_argument("--json", action="store_true", help="print one JSON object as the last line")
    args = parser.parse_args()

    from qgmem.data.loaders import load_cases
    from qgmem.memory.config import ConstructionConfig
    from qgmem.memory.extract_heuristic import SENTENCE_OUTCOMES
    from qgmem.reranker_training import convomem_splits

    config = ConstructionConfig()
    results = {}
    for name in args.sets:
        if name == "convomem_val":
            cases = convomem_splits(list(load_cases("convomem", ROOT / "data" / "convomem").cases))["val"]
        else:
            cases = list(load_cases("locomo", FIXTURE).cases)
        counts, turns = outcomes(cases, config)
        roles = sorted({key.split("/")[0] for key in counts})
        results[name] = {"cases": len(cases), "outcomes": dict(sorted(counts.items())),
                         "turns": dict(sorted(turns.items()))}
        print(f"\n## {name} ({len(cases)} cases)")
        print("| role | " + " | ".join(SENTENCE_OUTCOMES) + " | unread share of content |")
        print("|" + " --- |" * (len(SENTENCE_OUTCOMES) + 2))
        for role in roles:
            row = [counts.get(f"{role}/{o}", 0) for o in SENTENCE_OUTCOMES]
            read, unread = counts.get(f"{role}/read", 0), counts.get(f"{role}/unread", 0)
            share = unread / (read + unread) if read + unread else 0.0
            print(f"| {role} | " + " | ".join(f"{n:,}" for n in row) + f" | {share:.3f} |")
        print("\n| role | new turns | with a unit | no unit, an unread sentence | nothing |\n| --- | --- | --- | --- | --- |")
        for role in roles:
            kinds = [turns.get(f"{role}/{k}", 0) for k in ("units", "unread_only", "nothing")]
            print(f"| {role} | {sum(kinds):,} | " + " | ".join(f"{n:,}" for n in kinds) + " |")
    if args.json:
        print(json.dumps(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
