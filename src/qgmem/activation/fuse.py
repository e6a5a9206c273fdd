"""Reciprocal-rank fusion of the channels' ranked lists into one candidate pool."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Fused:
    """One pooled candidate: its store index, fused score, and its 1-based rank in each channel."""

    index: int
    score: float
    ranks: dict[str, int] = field(default_factory=dict)


def check_fusion_weights(weights: dict[str, float], channels: tuple[str, ...] | None = None,
                         what: str = "fusion weights") -> None:
    """Every weight is > 0 (and, with ``channels``, names one of them): a zero weight would pool a
    channel's hits without letting them score."""
    bad = {name: w for name, w in weights.items() if not w > 0 or (channels is not None and name not in channels)}
    if bad:
        rule = f"must map channels of {'/'.join(channels)} to weights > 0" if channels is not None else "must be > 0"
        raise ValueError(f"{what} {rule}, got {bad}")


def reciprocal_rank_fusion(rankings: dict[str, list[int]], rrf_k: float = 60.0, pool_size: int = 100,
                           weights: dict[str, float] | None = None) -> list[Fused]:
    """``score(u) = sum over channels c of w_c / (rrf_k + rank_c(u))``, best first, at most ``pool_size``.

    Rank-based, so channels with incomparable scores (BM25, cosine, attribute counts) fuse without
    calibration; ``rrf_k`` damps the weight of the very top ranks. ``weights`` gives a channel more (or
    less) say than the others; a channel it does not name weighs 1 (plain RRF). Ties keep the order of
    first appearance over channels in the given order, which makes the pool deterministic.
    """
    if rrf_k < 0:
        raise ValueError(f"rrf_k must be >= 0, got {rrf_k}")
    weights = weights or {}
    check_fusion_weights(weights)
    pooled: dict[int, Fused] = {}
    for channel, ranked in rankings.items():
        weight = weights.get(channel, 1.0)
        seen: set[int] = set()
        rank = 0
        for index in ranked:
            if index in seen:
                continue
            seen.add(index)
            rank += 1
            item = pooled.setdefault(index, Fused(index=index, score=0.0))
            item.score += weight / (rrf_k + rank)
            item.ranks[channel] = rank
    order = {index: i for i, index in enumerate(pooled)}
    return sorted(pooled.values(), key=lambda f: (-f.score, order[f.index]))[:pool_size]
