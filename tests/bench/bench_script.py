"""Load a ``bench/`` script as a module, so tests call its functions as its command line does."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

REPO = Path(__file__).resolve().parents[2]


def load_bench_script(module: str) -> ModuleType:
    """``bench.<topic>.<script>`` (the name ``python -m`` runs), executed afresh on every call."""
    spec = importlib.util.spec_from_file_location(module, REPO.joinpath(*module.split(".")).with_suffix(".py"))
    loaded = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(loaded)
    return loaded
