"""Deterministic sampling and grouped train/val/test splits.

Splits are grouped (by person by default) so that no person's conversations are seen in training and
tested on. A small sample may hold fewer persons than splits (the shipped ConvoMem sample has one);
then grouping falls back to the dialogue with a warning rather than failing or leaking silently.
"""

from __future__ import annotations

import logging
import random
import warnings
from collections.abc import Sequence

from qgmem.data.records import Case

logger = logging.getLogger(__name__)
SPLITS = ("train", "val", "test")


def sample_cases(cases: Sequence[Case], n: int | None, seed: int = 0) -> list[Case]:
    """``n`` cases drawn without replacement (all when ``n`` is None or too large), in input order."""
    if n is None or n >= len(cases):
        return list(cases)
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    keep = sorted(random.Random(seed).sample(range(len(cases)), n))
    return [cases[i] for i in keep]


def _warn(message: str) -> None:
    logger.warning(message)
    warnings.warn(message, UserWarning, stacklevel=3)


def _groups(cases: Sequence[Case], key: str) -> dict[str, list[int]] | None:
    groups: dict[str, list[int]] = {}
    for i, case in enumerate(cases):
        try:
            g = case.group_key(key)
        except KeyError:
            return None
        groups.setdefault(g, []).append(i)
    return groups


def split_cases(cases: Sequence[Case], ratios: Sequence[float] = (0.7, 0.15, 0.15), seed: int = 0,
                group_key: str = "person") -> dict[str, list[Case]]:
    """Partition cases into ``train``/``val``/``test`` so that no group is in two splits.

    Groups are shuffled with ``seed`` and each goes to the split furthest below its target share of
    cases (after every split with a non-zero ratio got one group), so sizes follow ``ratios`` as
    closely as whole groups allow. With fewer groups than such splits, or cases lacking the key,
    grouping falls back to ``"dialogue"`` with a warning. Each split keeps the input order.
    """
    if len(ratios) != 3 or any(r < 0 for r in ratios) or sum(ratios) <= 0:
        raise ValueError(f"ratios must be three non-negative numbers with a positive sum, got {tuple(ratios)}")
    if group_key not in ("person", "dialogue"):
        raise ValueError(f"group_key must be 'person' or 'dialogue', got {group_key!r}")
    total = float(sum(ratios))
    shares = [r / total for r in ratios]
    active = [k for k, s in enumerate(shares) if s > 0]
    groups = _groups(cases, group_key)
    if group_key != "dialogue" and (groups is None or len(groups) < len(active)):
        found = "some cases have none" if groups is None else f"only {len(groups)}"
        _warn(f"split by {group_key!r} needs at least {len(active)} groups but {found}; splitting by "
              "'dialogue' instead, so one person may appear in several splits")
        groups = _groups(cases, "dialogue")
    assert groups is not None  # every case has a dialogue
    keys = sorted(groups)
    random.Random(seed).shuffle(keys)
    targets = [s * len(cases) for s in shares]
    sizes = [0, 0, 0]
    members: list[list[int]] = [[], [], []]
    for n, key in enumerate(keys):
        if n < len(active):
            k = active[n]
        else:
            k = max(active, key=lambda a: (targets[a] - sizes[a], -a))
        members[k].extend(groups[key])
        sizes[k] += len(groups[key])
    return {name: [cases[i] for i in sorted(idx)] for name, idx in zip(SPLITS, members)}


def run_splits(cases: Sequence[Case], num_cases: int | None, seed: int, ratios: Sequence[float],
               group_key: str) -> dict[str, list[Case]]:
    """A run's splits: ``num_cases`` cases drawn with ``seed`` (all when ``None``), then :func:`split_cases`
    with the same seed. The one rule by which the sample build made a run's splits, and by which
    ``eval-qa --split`` and the reranker's held-out cases find them again."""
    return split_cases(sample_cases(cases, num_cases, seed), ratios, seed, group_key)
