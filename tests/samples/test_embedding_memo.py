"""EmbeddingMemo: each distinct text is encoded once, within a process and across processes via disk."""

from __future__ import annotations

import numpy as np
import pytest

from qgmem.samples.embedding_memo import EmbeddingMemo


class CountingEncoder:
    """Deterministic vectors from the text's characters; counts the texts it is asked to encode."""

    model_id = "test:counting"

    def __init__(self, dim: int = 6):
        self.dim, self.calls = dim, 0

    def encode(self, texts):
        self.calls += len(texts)
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        for i, text in enumerate(texts):
            for j, ch in enumerate(text):
                out[i, (ord(ch) + j) % self.dim] += 1.0
        return out


TEXTS = ["the user likes green", "Dana Lee", "likes", "the user likes green", "works at", "Dana Lee"]


@pytest.mark.parametrize("flush_every", [1, 2, 100])
def test_vectors_equal_the_encoders_and_repeats_are_encoded_once(tmp_path, flush_every):
    inner = CountingEncoder()
    memo = EmbeddingMemo(inner, tmp_path / "memo", flush_every=flush_every)
    out = memo.encode(TEXTS)
    assert out.shape == (6, 6) and out.dtype == np.float32
    np.testing.assert_array_equal(out, CountingEncoder().encode(TEXTS))
    assert inner.calls == 4  # four distinct texts
    assert memo.encode(["likes", "Dana Lee"]).shape == (2, 6) and inner.calls == 4
    assert memo.stats() == {"loaded": 0, "hits": 4, "encoded": 4}
    assert memo.encode([]).shape == (0, 6)


def test_a_second_process_reads_the_first_ones_vectors(tmp_path):
    first = EmbeddingMemo(CountingEncoder(), tmp_path / "memo", flush_every=3)
    expected = np.concatenate([first.encode(TEXTS[:3]), first.encode(TEXTS[3:])])
    assert len(list((tmp_path / "memo").glob("chunk-*"))) == 1  # the first three distinct texts
    first.flush()
    assert len(list((tmp_path / "memo").glob("chunk-*"))) == 2  # and the fourth
    inner = CountingEncoder()
    second = EmbeddingMemo(inner, tmp_path / "memo")
    assert second.loaded == 4
    np.testing.assert_array_equal(second.encode(TEXTS), expected)
    assert inner.calls == 0
    second.flush()  # nothing new: no empty chunk
    assert len(list((tmp_path / "memo").glob("chunk-*"))) == 2


def test_two_writers_of_one_folder_keep_both_parts(tmp_path):
    a, b = (EmbeddingMemo(CountingEncoder(), tmp_path / "memo") for _ in range(2))
    a.encode(["only in a", "shared"])
    b.encode(["only in b", "shared"])
    a.flush()
    b.flush()
    inner = CountingEncoder()
    merged = EmbeddingMemo(inner, tmp_path / "memo")
    merged.encode(["only in a", "only in b", "shared"])
    assert merged.loaded == 3 and inner.calls == 0


def test_max_entries_bounds_what_is_loaded(tmp_path):
    writer = EmbeddingMemo(CountingEncoder(), tmp_path / "memo", flush_every=1)
    for text in ("one", "two", "three"):
        writer.encode([text])  # one chunk each
    bounded = EmbeddingMemo(CountingEncoder(), tmp_path / "memo", max_entries=2)
    assert bounded.loaded == 2
