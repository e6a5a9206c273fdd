"""Fixtures for memory tests: the deterministic encoder (real MiniLM only where a test says slow)."""

from __future__ import annotations

import pytest

from .helpers import BagOfWordsEncoder


@pytest.fixture()
def bow_encoder() -> BagOfWordsEncoder:
    return BagOfWordsEncoder()
