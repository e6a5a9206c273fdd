"""The entry points choose sleeping OpenMP waits before torch loads, and keep a user's own choice."""

from __future__ import annotations

import subprocess
import sys

from qgmem.omp import prefer_passive_waiting


def test_sets_passive_only_when_unset(monkeypatch):
    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    prefer_passive_waiting()
    import os

    assert os.environ["OMP_WAIT_POLICY"] == "PASSIVE"
    monkeypatch.setenv("OMP_WAIT_POLICY", "ACTIVE")
    prefer_passive_waiting()
    assert os.environ["OMP_WAIT_POLICY"] == "ACTIVE"


def test_the_command_line_sets_it_before_torch_is_imported():
    """Importing the CLI module must not load torch, or the setting would come too late."""
    code = ("import os, sys; os.environ.pop('OMP_WAIT_POLICY', None); import qgmem.cli as c; "
            "assert 'torch' not in sys.modules; c.main(['--version']); print(os.environ['OMP_WAIT_POLICY'])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == "PASSIVE"
