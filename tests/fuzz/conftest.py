"""Makes the data-test file builders importable here as ``tests_data_helpers``."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

_spec = importlib.util.spec_from_file_location("tests_data_helpers", Path(__file__).parents[1] / "data" / "conftest.py")
_module = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_module)
sys.modules.setdefault("tests_data_helpers", _module)
