"""Shared test settings and fixtures: offline hubs, small thread counts, real embedded models once."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from pathlib import Path  # noqa: E402

import pytest  # noqa: E402

REPO_ROOT = Path(__file__).resolve().parents[1]
CONVOMEM_SAMPLE = REPO_ROOT / "data" / "convomem"


@pytest.fixture(scope="session")
def convomem_path() -> Path:
    """The real ConvoMem sample shipped in ``data/convomem`` (CC-BY-NC-4.0, see its SOURCE.md)."""
    return CONVOMEM_SAMPLE


@pytest.fixture(scope="session")
def sentence_encoder():
    """The real embedded MiniLM sentence encoder, loaded once per test session."""
    from qgmem.embed import SentenceEncoder

    return SentenceEncoder()


@pytest.fixture(scope="session")
def smollm2_tokenizer():
    """SmolLM2's tokenizer (loads offline from the embedded model); pairs well with tiny random LMs."""
    from qgmem.lm import EMBEDDED_LM, load_tokenizer

    return load_tokenizer(EMBEDDED_LM)
