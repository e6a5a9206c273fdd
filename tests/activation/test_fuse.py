from __future__ import annotations

import pytest

from qgmem.activation.fuse import reciprocal_rank_fusion


@pytest.mark.parametrize("rrf_k", [0.0, 1.0, 60.0])
def test_rrf_scores_are_exact(rrf_k):
    fused = reciprocal_rank_fusion({"a": [7, 3, 5], "b": [3, 9], "c": [5]}, rrf_k=rrf_k, pool_size=10)
    expected = {
        7: 1 / (rrf_k + 1),
        3: 1 / (rrf_k + 2) + 1 / (rrf_k + 1),
        5: 1 / (rrf_k + 3) + 1 / (rrf_k + 1),
        9: 1 / (rrf_k + 2),
    }
    assert {f.index: f.score for f in fused} == pytest.approx(expected)
    assert [f.index for f in fused] == sorted(expected, key=lambda i: -expected[i])
    assert fused[0].index == 3 and fused[0].ranks == {"a": 2, "b": 1}


def test_rrf_pool_size_duplicates_and_ties():
    fused = reciprocal_rank_fusion({"a": [1, 1, 2, 3, 4], "b": [2, 1]}, rrf_k=60, pool_size=2)
    assert len(fused) == 2
    assert fused[0].ranks == {"a": 1, "b": 2} and fused[1].ranks == {"a": 2, "b": 1}  # duplicate 1 ignored
    assert fused[0].index == 1  # equal scores keep first appearance
    assert reciprocal_rank_fusion({}, pool_size=5) == []
    with pytest.raises(ValueError):
        reciprocal_rank_fusion({"a": [1]}, rrf_k=-1)
