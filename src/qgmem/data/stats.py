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
from dataclasses import dataclass, field
from typing import Any, Literal

from qgmem.data.loaders import DATASETS, LoadedData, add_load_arguments, load_arguments, load_cases
from qgmem.data.records import Case
from qgmem.data.splits import SPLITS, split_cases
from qgmem.errors import UserError
from qgmem.settings_flags import add_settings_arguments, settings_from_args


def _share(text: str) -> float:
    """One number of ``--split-ratios``; a bad one is argparse's one line naming the flag."""
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid float value: {text!r}") from None


@dataclass
class DataStatsSettings:
    """What ``qgmem data-stats`` runs with; one field per flag (beside ``--strict``/``--lenient``, ``--max-turn-chars``)."""

    dataset: Literal[DATASETS]  #: the data set's form
    path: str  #: local file or folder (ConvoMem: also a hub id)
    json: bool = False  #: end with one line of JSON
    #: shares of the train, val and test splits
    split_ratios: list[float] = field(default_factory=lambda: [0.7, 0.15, 0.15],
                                      metadata={"nargs": 3, "type": _share, "metavar": ("TRAIN", "VAL", "TEST")})
    group_key: Literal["person", "dialogue"] = "person"  #: what a split keeps together
    seed: int = 0  #: seed of histories (ConvoMem) and splits
    distractor_conversations: int | None = None  #: ConvoMem: distractor conversations per history




def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_settings_arguments(parser, DataStatsSettings)
    add_load_arguments(parser)


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
    s = settings_from_args(DataStatsSettings, args)
    options: dict[str, Any] = {}
    if s.distractor_conversations is not None:
        if s.dataset != "convomem":
            raise UserError("--distractor-conversations applies to --dataset convomem only")
        options["distractor_conversations"] = s.distractor_conversations
    if s.dataset == "convomem":
        options["seed"] = s.seed
    loaded = load_cases(s.dataset, s.path, **load_arguments(args), **options)
    stats = compute_stats(loaded, tuple(s.split_ratios), seed=s.seed, group_key=s.group_key)
    print(format_table(stats))
    if s.json:
        print(json.dumps(stats, ensure_ascii=False))
    return 0
