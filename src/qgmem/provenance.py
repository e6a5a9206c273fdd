"""Which code produced a result: the package version and, in a git checkout, the commit.

``metrics.json`` and an export's ``config.json`` carry it, so a figure or a served model can be traced
back to its source. An installed package outside a checkout has no commit (``None``).
"""

from __future__ import annotations

import functools
import subprocess
from pathlib import Path
from typing import Any

from qgmem import __version__


@functools.lru_cache(maxsize=1)
def git_commit() -> str | None:
    """The commit of the checkout this package is imported from (``None`` outside one, or without git)."""
    here = Path(__file__).resolve().parent
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=here, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    commit = out.stdout.strip()
    return commit if out.returncode == 0 and len(commit) == 40 else None


def provenance() -> dict[str, Any]:
    """``{"qgmem_version": ..., "git_commit": ...}``."""
    return {"qgmem_version": __version__, "git_commit": git_commit()}
