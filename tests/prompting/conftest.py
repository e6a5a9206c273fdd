"""A tokenizer whose chat template has a thinking switch, like Qwen3's (built from SmolLM2's tokenizer)."""

from __future__ import annotations

import copy

import pytest

from qgmem.model.random_lm import THINKING_TEMPLATE


@pytest.fixture(scope="session")
def thinking_tokenizer(smollm2_tokenizer):
    tok = copy.deepcopy(smollm2_tokenizer)
    tok.chat_template = THINKING_TEMPLATE
    return tok
