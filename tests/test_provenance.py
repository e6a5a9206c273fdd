"""The version and commit that results carry."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from qgmem import __version__
from qgmem.provenance import git_commit, provenance

REPO = Path(__file__).resolve().parents[1]


def test_provenance_is_the_version_and_the_checkouts_commit():
    found = provenance()
    assert found["qgmem_version"] == __version__
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True)
    if head.returncode != 0:
        pytest.skip("not a git checkout")
    assert found["git_commit"] == head.stdout.strip() and len(found["git_commit"]) == 40


def test_no_git_is_no_commit(monkeypatch):
    git_commit.cache_clear()
    monkeypatch.setenv("PATH", "")  # git cannot be found
    try:
        assert git_commit() is None
    finally:
        git_commit.cache_clear()
