"""``qgmem data-stats``: what a data set holds once loaded, and how its evidence was mapped.

Prints a table of cases, sessions, turns and QAs per category and per split, plus the evidence
mapping outcome; with ``--json`` the last printed line is one JSON object (for scripts and CI).
"""

from __future__ import annotations

import argparse
import json
import warnings
from collections import Counter
from collections.abc import Sequence
from typing import Any

from qgmem.data.loaders import DATASETS, LoadedData, add_load_arguments, load_arguments, load_cases
from qgmem.data.records import Case
from qgmem.data.splits import SPLITS, split_cases
from qgmem.errors import UserError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--dataset", required=True, choices=DATASETS)
    parser.add_argument("--path", required=True, help="local file or folder (ConvoMem: also a hub id)")
    parser.add_argument("--json", action="store_true", help="end with one line of JSON")
    add_load_arguments(parser)
    parser.add_argument("--split-ratios", type=float, nargs=3, default=(0.7, 0.15, 0.15),
                        metavar=("TRAIN", "VAL", "TEST"))
    parser.add_argument("--group-key", choices=("person", "dialogue"), default="person")
    parser.add_argument("--seed", type=int, default=0, help="seed of histories (ConvoMem) and splits")
    parser.add_argument("--distractor-conversations", type=int, default=None,
                        help="ConvoMem: distractor conversations per history")


def _counts(cases: Sequence[Case]) -> dict[str, Any]:
    dialogues = {id(c.dialogue): c.dialogue for c in cases}.values()  # pre-mixed cases share one
    return {
        "cases": len(cases),
        "dialogues": len(dialogues),
        "sessions": sum(len(d.sessions) for d in dialogues),
        "turns": sum(d.num_turns() for d in dialogues),
        "qas": sum(len(c.qas) for c in cases),
        "qas_per_category": dict(sorted(Counter(q.category for c in cases for q in c.qas).items())),
    }


def compute_stats(loaded: LoadedData, ratios: Sequence[float] = (0.7, 0.15, 0.15), seed: int = 0,
                  group_key: str = "person") -> dict[str, Any]:
    """The figures ``data-stats`` prints, as one JSON-ready dict."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        splits = split_cases(loaded.cases, ratios, seed=seed, group_key=group_key)
    report = loaded.report
    turns = [c.dialogue.num_turns() for c in loaded.cases]
    return {
        "dataset": report["dataset"],
        "path": report["path"],
        **_counts(loaded.cases),
        "turns_per_case": {"min": min(turns, default=0), "mean": round(sum(turns) / max(len(turns), 1), 1),
                           "max": max(turns, default=0)},
        "splits": {name: _counts(splits[name]) for name in SPLITS},
        "split_ratios": list(ratios),
        "group_key": group_key,
        "split_warnings": [str(w.message) for w in caught],
        "evidence": report["evidence"],
        "files_read": len(report["files_read"]),
        "items": report["items"],
        "skipped": report["skipped"],
        "skip_reasons": report["skip_reasons"],
        "truncated_turns": report.get("truncated_turns", 0),
        "truncated_examples": report.get("truncated_examples", []),
        "max_turn_chars": report.get("max_turn_chars"),
    }


def format_table(stats: dict[str, Any]) -> str:
    """A plain-text table of the figures (categories as rows, all/splits as columns)."""
    cols = ["all", *SPLITS]
    blocks = [stats, *(stats["splits"][s] for s in SPLITS)]
    cats = sorted(stats["qas_per_category"])
    rows = [(k, [str(b[k]) for b in blocks]) for k in ("cases", "dialogues", "sessions", "turns", "qas")]
    rows += [(f"  qas: {c}", [str(b["qas_per_category"].get(c, 0)) for b in blocks]) for c in cats]
    width = max(len(r[0]) for r in rows) + 2
    lines = [f"{stats['dataset']} at {stats['path']} ({stats['files_read']} files, {stats['items']} items, "
             f"{stats['skipped']} skipped)",
             "".join([" " * width, *(f"{c:>10}" for c in cols)])]
    lines += ["".join([f"{name:<{width}}", *(f"{v:>10}" for v in vals)]) for name, vals in rows]
    t = stats["turns_per_case"]
    lines.append(f"turns per case: min {t['min']}, mean {t['mean']}, max {t['max']}")
    ev = stats["evidence"]
    lines.append(f"evidence mapping: exact {ev['exact']}, contained {ev['contained']}, fuzzy {ev['fuzzy']}, "
                 f"normalized {ev['normalized']}, unmatched {ev['unmatched']} (of {ev['total']})")
    lines += [f"  unmatched: {u}" for u in ev["unmatched_examples"]]
    lines += [f"warning: {w}" for w in stats["split_warnings"]]
    lines += [f"skipped: {s}" for s in stats["skip_reasons"]]
    if stats.get("truncated_turns"):
        lines.append(f"warning: {stats['truncated_turns']} turns cut at --max-turn-chars {stats['max_turn_chars']}")
        lines += [f"  cut: {t}" for t in stats["truncated_examples"]]
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    options: dict[str, Any] = {}
    if args.distractor_conversations is not None:
        if args.dataset != "convomem":
            raise UserError("--distractor-conversations applies to --dataset convomem only")
        options["distractor_conversations"] = args.distractor_conversations
    if args.dataset == "convomem":
        options["seed"] = args.seed
    loaded = load_cases(args.dataset, args.path, **load_arguments(args), **options)
    stats = compute_stats(loaded, args.split_ratios, seed=args.seed, group_key=args.group_key)
    print(format_table(stats))
    if args.json:
        print(json.dumps(stats, ensure_ascii=False))
    return 0
