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


@pytest.fixture()
def keep_torch_threads():
    """A bench script sets torch's thread count for the whole process; later tests must not inherit it."""
    import torch

    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


@pytest.fixture()
def hash_encoder():
    """A deterministic bag-of-words encoder (``tests/activation/helpers.py``)."""
    from activation.helpers import HashEncoder

    return HashEncoder()


@pytest.fixture()
def small_store(hash_encoder):
    """The hand-made store of ``tests/activation/helpers.py`` (activation, evaluation, reranker training)."""
    from activation.helpers import build_small_store

    return build_small_store(hash_encoder)


@pytest.fixture(scope="session")
def tiny_lm_path(tmp_path_factory):
    """A random 1-layer Llama with SmolLM2's tokenizer and chat template (serving and evaluation tests)."""
    from qgmem.model.random_lm import save_random_lm
    from serving.helpers import HIDDEN

    return str(save_random_lm(tmp_path_factory.mktemp("lm") / "tiny", hidden_size=HIDDEN, layers=1))


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
