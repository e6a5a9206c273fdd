"""Fixtures for evaluation tests: the activation tests' hand-made store and the serving tests' tiny LM."""

from __future__ import annotations

import pytest

from activation.helpers import HashEncoder, build_small_store
from qgmem.memory.store import MemoryStore
from qgmem.model.random_lm import save_random_lm
from serving.helpers import HIDDEN


@pytest.fixture()
def hash_encoder() -> HashEncoder:
    return HashEncoder()


@pytest.fixture()
def small_store(hash_encoder) -> MemoryStore:
    return build_small_store(hash_encoder)


@pytest.fixture(scope="session")
def tiny_lm_path(tmp_path_factory):
    """A random 1-layer Llama with SmolLM2's tokenizer and chat template."""
    return str(save_random_lm(tmp_path_factory.mktemp("lm") / "tiny", hidden_size=HIDDEN, layers=1))
