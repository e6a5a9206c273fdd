"""Percentile bootstrap intervals for paired differences: over groups, and over seeds then groups.

The learning check (:mod:`qgmem.evaluation.protocol`) and ``qgmem eval-qa`` report paired answer-NLL
differences with these intervals, so both read the same way.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np


def paired_bootstrap(diffs: Sequence[float], groups: Sequence[str] | None = None, *, n_boot: int = 10_000,
                     seed: int = 0, level: float = 0.95) -> dict[str, Any]:
    """Mean of paired differences with a percentile bootstrap interval over groups (samples if ``None``).

    Each bootstrap draw resamples whole groups with replacement and takes the mean of the differences
    of all samples drawn, so correlated samples of one group move together.
    """
    d = np.asarray(diffs, dtype=np.float64)
    if d.size == 0:
        return {"mean": None, "ci95": [None, None], "n": 0, "groups": 0}
    keys = np.asarray(groups if groups is not None else np.arange(d.size).astype(str))
    uniq, inverse = np.unique(keys, return_inverse=True)
    sums = np.bincount(inverse, weights=d, minlength=len(uniq))
    sizes = np.bincount(inverse, minlength=len(uniq)).astype(np.float64)
    rng = np.random.default_rng(seed)
    draws = rng.integers(0, len(uniq), size=(n_boot, len(uniq)))
    means = sums[draws].sum(1) / sizes[draws].sum(1)
    alpha = (1 - level) / 2
    lo, hi = np.quantile(means, [alpha, 1 - alpha])
    return {"mean": float(d.mean()), "ci95": [float(lo), float(hi)], "n": int(d.size), "groups": int(len(uniq))}


def hierarchical_bootstrap(diffs: Any, groups: Sequence[str] | None = None, *, n_boot: int = 10_000,
                           seed: int = 0, level: float = 0.95) -> dict[str, Any]:
    """Mean of paired differences ``[seeds, samples]`` with a two-level percentile bootstrap interval.

    Each draw resamples the seeds with replacement and, inside every drawn seed, the groups (samples
    when ``groups`` is ``None``) with replacement, then takes the mean of all differences drawn. A
    seed-to-seed spread therefore widens the interval, which a bootstrap over seed-averaged samples
    hides. ``NaN`` marks a sample without a score in that seed (it counts nowhere). Also returns each
    seed's mean and its own interval over groups.
    """
    d = np.atleast_2d(np.asarray(diffs, dtype=np.float64))
    valid = np.isfinite(d)
    if not valid.any():
        return {"mean": None, "ci95": [None, None], "n": 0, "groups": 0, "seeds": int(d.shape[0]),
                "per_seed": []}
    keys = np.asarray(groups if groups is not None else np.arange(d.shape[1]).astype(str))
    uniq, inverse = np.unique(keys, return_inverse=True)
    S, G = d.shape[0], len(uniq)
    sums, sizes = np.zeros((S, G)), np.zeros((S, G))
    for s_ in range(S):
        sums[s_] = np.bincount(inverse, weights=np.where(valid[s_], d[s_], 0.0), minlength=G)
        sizes[s_] = np.bincount(inverse, weights=valid[s_].astype(np.float64), minlength=G)
    rng = np.random.default_rng(seed)
    means = np.empty(n_boot)
    chunk = max(1, 2_000_000 // max(1, S * G))
    for start in range(0, n_boot, chunk):
        b = min(chunk, n_boot - start)
        seed_draw = rng.integers(0, S, size=(b, S, 1))
        group_draw = rng.integers(0, G, size=(b, S, G))
        num = sums[seed_draw, group_draw].sum((1, 2))
        den = sizes[seed_draw, group_draw].sum((1, 2))
        means[start:start + b] = np.where(den > 0, num / np.maximum(den, 1e-12), np.nan)
    alpha = (1 - level) / 2
    lo, hi = np.nanquantile(means, [alpha, 1 - alpha])
    per_seed = []
    for s_ in range(S):
        row = paired_bootstrap(d[s_][valid[s_]], keys[valid[s_]], n_boot=max(1000, n_boot // 5), seed=seed + s_,
                               level=level)
        per_seed.append({"mean": row["mean"], "ci95": row["ci95"]})
    return {"mean": float(d[valid].mean()), "ci95": [float(lo), float(hi)], "n": int(valid.any(0).sum()),
            "groups": int(len(np.unique(keys[valid.any(0)]))), "seeds": int(S), "per_seed": per_seed}


__all__ = ["hierarchical_bootstrap", "paired_bootstrap"]
