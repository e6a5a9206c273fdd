from __future__ import annotations

import pytest

from qgmem.model.random_lm import save_random_lm

from .helpers import HIDDEN


@pytest.fixture(scope="session")
def tiny_lm_path(tmp_path_factory):
    """A random 1-layer Llama with SmolLM2's tokenizer and chat template."""
    return str(save_random_lm(tmp_path_factory.mktemp("lm") / "tiny", hidden_size=HIDDEN, layers=1))
