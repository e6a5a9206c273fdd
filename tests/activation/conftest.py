"""Fixtures for activation tests: a deterministic bag-of-words encoder and a hand-made store."""

from __future__ import annotations

import pytest

from qgmem.memory.store import MemoryStore

from .helpers import HashEncoder, build_small_store


@pytest.fixture()
def hash_encoder() -> HashEncoder:
    return HashEncoder()


@pytest.fixture()
def small_store(hash_encoder) -> MemoryStore:
    return build_small_store(hash_encoder)
