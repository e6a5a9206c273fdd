"""Percentile bootstrap intervals for paired differences: over groups, and over seeds and groups.

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


DESIGNS = ("crossed", "nested")


def hierarchical_bootstrap(diffs: Any, groups: Sequence[str] | None = None, *, design: str, n_boot: int = 10_000,
                           seed: int = 0, level: float = 0.95) -> dict[str, Any]:
    """Mean of paired differences ``[seeds, samples]`` with a two-level percentile bootstrap interval.

    ``design`` says how seeds and samples relate, and there is no default because a wrong choice gives
    a wrong interval:

    - ``"crossed"``: every seed scores the same samples (column ``j`` is one question in every seed),
      as in the learning check. Each draw resamples the seeds with replacement and the groups (samples
      when ``groups`` is ``None``) **once**, that one group draw shared by every drawn seed: a question
      that is hard in one seed is hard in all of them, so seeds must not multiply the questions.
    - ``"nested"``: each seed scores its own samples (column ``j`` of seed ``s`` is unrelated to column
      ``j`` of another seed). Each draw resamples the seeds and, inside every drawn seed, its groups.

    A seed-to-seed spread widens either interval, which a bootstrap over seed-averaged samples hides.
    ``NaN`` marks a sample without a score in that seed (it counts nowhere). Also returns each seed's
    mean and its own interval over groups.
    """
    if design not in DESIGNS:
        raise ValueError(f"design must be one of {list(DESIGNS)}, got {design!r}")
    d = np.atleast_2d(np.asarray(diffs, dtype=np.float64))
    valid = np.isfinite(d)
    if not valid.any():
        return {"mean": None, "ci95": [None, None], "n": 0, "groups": 0, "seeds": int(d.shape[0]),
                "design": design, "per_seed": []}
    keys = np.asarray(groups if groups is not None else np.arange(d.shape[1]).astype(str))
    uniq, inverse = np.unique(keys, return_inverse=True)
    S, G = d.shape[0], len(uniq)
    sums, sizes = np.zeros((S, G)), np.zeros((S, G))
    for s_ in range(S):
        sums[s_] = np.bincount(inverse, weights=np.where(valid[s_], d[s_], 0.0), minlength=G)
        sizes[s_] = np.bincount(inverse, weights=valid[s_].astype(np.float64), minlength=G)
    rng = np.random.default_rng(seed)
    means = _crossed_means(sums, sizes, n_boot, rng) if design == "crossed" else _nested_means(sums, sizes, n_boot, rng)
    alpha = (1 - level) / 2
    lo, hi = np.nanquantile(means, [alpha, 1 - alpha])
    per_seed = []
    for s_ in range(S):
        row = paired_bootstrap(d[s_][valid[s_]], keys[valid[s_]], n_boot=max(1000, n_boot // 5), seed=seed + s_,
                               level=level)
        per_seed.append({"mean": row["mean"], "ci95": row["ci95"]})
    return {"mean": float(d[valid].mean()), "ci95": [float(lo), float(hi)], "n": int(valid.any(0).sum()),
            "groups": int(len(np.unique(keys[valid.any(0)]))), "seeds": int(S), "design": design,
            "per_seed": per_seed}


def _draw_counts(rng: np.random.Generator, b: int, n: int) -> np.ndarray:
    """``[b, n]``: how often each of ``n`` items is drawn in each of ``b`` resamples of size ``n``."""
    draw = rng.integers(0, n, size=(b, n)) + n * np.arange(b)[:, None]
    return np.bincount(draw.ravel(), minlength=b * n).reshape(b, n).astype(np.float64)


def _crossed_means(sums: np.ndarray, sizes: np.ndarray, n_boot: int, rng: np.random.Generator) -> np.ndarray:
    """One seed draw and one group draw per resample; a drawn (seed, group) pair counts as often as both."""
    S, G = sums.shape
    means = np.empty(n_boot)
    chunk = max(1, 2_000_000 // max(1, S + G))
    for start in range(0, n_boot, chunk):
        b = min(chunk, n_boot - start)
        seed_count, group_count = _draw_counts(rng, b, S), _draw_counts(rng, b, G)
        num = ((seed_count @ sums) * group_count).sum(1)
        den = ((seed_count @ sizes) * group_count).sum(1)
        means[start:start + b] = np.where(den > 0, num / np.maximum(den, 1e-12), np.nan)
    return means


def _nested_means(sums: np.ndarray, sizes: np.ndarray, n_boot: int, rng: np.random.Generator) -> np.ndarray:
    """A seed draw per resample and, inside every drawn seed, its own group draw."""
    S, G = sums.shape
    means = np.empty(n_boot)
    chunk = max(1, 2_000_000 // max(1, S * G))
    for start in range(0, n_boot, chunk):
        b = min(chunk, n_boot - start)
        seed_draw = rng.integers(0, S, size=(b, S, 1))
        group_draw = rng.integers(0, G, size=(b, S, G))
        num = sums[seed_draw, group_draw].sum((1, 2))
        den = sizes[seed_draw, group_draw].sum((1, 2))
        means[start:start + b] = np.where(den > 0, num / np.maximum(den, 1e-12), np.nan)
    return means


__all__ = ["DESIGNS", "hierarchical_bootstrap", "paired_bootstrap"]
