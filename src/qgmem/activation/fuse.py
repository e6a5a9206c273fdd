"""Reciprocal-rank fusion of the channels' ranked lists into one candidate pool."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Fused:
    """One pooled candidate: its store index, fused score, and its 1-based rank in each channel."""

    index: int
    score: float
    ranks: dict[str, int] = field(default_factory=dict)


def reciprocal_rank_fusion(rankings: dict[str, list[int]], rrf_k: float = 60.0, pool_size: int = 100) -> list[Fused]:
    """``score(u) = sum over channels c of 1 / (rrf_k + rank_c(u))``, best first, at most ``pool_size``.

    Rank-based, so channels with incomparable scores (BM25, cosine, attribute counts) fuse without
    calibration; ``rrf_k`` damps the weight of the very top ranks. Ties keep the order of first
    appearance over channels in the given order, which makes the pool deterministic.
    """
    if rrf_k < 0:
        raise ValueError(f"rrf_k must be >= 0, got {rrf_k}")
    pooled: dict[int, Fused] = {}
    for channel, ranked in rankings.items():
        seen: set[int] = set()
        rank = 0
        for index in ranked:
            if index in seen:
                continue
            seen.add(index)
            rank += 1
            item = pooled.setdefault(index, Fused(index=index, score=0.0))
            item.score += 1.0 / (rrf_k + rank)
            item.ranks[channel] = rank
    order = {index: i for i, index in enumerate(pooled)}
    return sorted(pooled.values(), key=lambda f: (-f.score, order[f.index]))[:pool_size]
