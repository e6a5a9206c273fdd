"""The bootstrap intervals: the crossed and nested designs, their coverage, and the design-blind control."""

from __future__ import annotations

import numpy as np
import pytest

from qgmem.evaluation.bootstrap import hierarchical_bootstrap, paired_bootstrap

SEEDS, GROUPS, PER_GROUP, TRUE_MEAN = 5, 60, 2, -0.01


def crossed_data(rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """``[seeds, questions]`` differences: the same questions in every seed (the learning check's design).

    A question's effect is shared by all seeds (and correlated within its dialogue), a seed's effect by
    all questions, plus a small seed × question noise; the population mean is ``TRUE_MEAN``.
    """
    group = 0.04 * rng.standard_normal(GROUPS).repeat(PER_GROUP)
    question = 0.02 * rng.standard_normal(GROUPS * PER_GROUP)
    seed = 0.004 * rng.standard_normal((SEEDS, 1))
    noise = 0.01 * rng.standard_normal((SEEDS, GROUPS * PER_GROUP))
    return TRUE_MEAN + group + question + seed + noise, np.arange(GROUPS).repeat(PER_GROUP).astype(str)


def nested_data(rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """``[seeds, questions]`` differences where every seed scores its own, independent questions."""
    group = 0.04 * rng.standard_normal((SEEDS, GROUPS)).repeat(PER_GROUP, axis=1)
    question = 0.02 * rng.standard_normal((SEEDS, GROUPS * PER_GROUP))
    seed = 0.006 * rng.standard_normal((SEEDS, 1))
    return TRUE_MEAN + group + question + seed, np.arange(GROUPS).repeat(PER_GROUP).astype(str)


def coverage(make, design: str, datasets: int = 800, n_boot: int = 800) -> float:
    """Share of simulated data sets whose 95 % interval holds ``TRUE_MEAN``."""
    rng = np.random.default_rng(2026)
    hits = 0
    for i in range(datasets):
        diffs, groups = make(rng)
        lo, hi = hierarchical_bootstrap(diffs, groups, design=design, n_boot=n_boot, seed=i)["ci95"]
        hits += lo <= TRUE_MEAN <= hi
    return hits / datasets


def test_design_is_required_and_checked():
    with pytest.raises(TypeError):
        hierarchical_bootstrap(np.zeros((2, 3)))  # no silent default
    with pytest.raises(ValueError, match="design"):
        hierarchical_bootstrap(np.zeros((2, 3)), design="paired")


def test_identical_seeds_give_the_one_seeds_interval():
    """Five copies of one seed hold no more information than that seed: crossed gives its width, nested not."""
    rng = np.random.default_rng(1)
    groups = np.arange(30).repeat(2).astype(str)
    one = 0.05 * rng.standard_normal(30).repeat(2) + 0.02 * rng.standard_normal(60)
    single = paired_bootstrap(one, groups, n_boot=8000)
    width = single["ci95"][1] - single["ci95"][0]
    crossed = hierarchical_bootstrap(np.tile(one, (5, 1)), groups, design="crossed", n_boot=8000)
    nested = hierarchical_bootstrap(np.tile(one, (5, 1)), groups, design="nested", n_boot=8000)
    assert crossed["ci95"][1] - crossed["ci95"][0] == pytest.approx(width, rel=0.08)
    assert crossed["ci95"][0] == pytest.approx(single["ci95"][0], abs=0.1 * width)
    # control: the nested computation counts 5 × 30 independent dialogues and is about 1/√5 as wide
    assert nested["ci95"][1] - nested["ci95"][0] < 0.6 * width


def test_crossed_interval_covers_the_truth_on_crossed_data():
    assert 0.93 <= coverage(crossed_data, "crossed") <= 0.97


def test_nested_interval_covers_the_truth_on_nested_data():
    assert 0.93 <= coverage(nested_data, "nested") <= 0.97


def test_nested_computation_fails_on_crossed_data():
    """Negative control: the old (nested) draw on crossed data divides the question variance by the seeds."""
    assert coverage(crossed_data, "nested") < 0.85


def test_crossed_interval_keeps_nan_cells_out():
    diffs = np.array([[1.0, np.nan, 3.0], [1.0, 2.0, np.nan]])
    r = hierarchical_bootstrap(diffs, design="crossed", n_boot=500)
    assert r["mean"] == pytest.approx(7.0 / 4) and r["n"] == 3
    assert 1.0 <= r["ci95"][0] <= r["ci95"][1] <= 3.0
