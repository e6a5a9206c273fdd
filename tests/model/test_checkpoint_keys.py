"""The checkpoint's own entries are named once (qgmem.model.checkpoint_keys): written by training, read by export."""

from __future__ import annotations

import ast
from pathlib import Path

import qgmem
from qgmem.model import checkpoint_keys as CK

ROOT = Path(qgmem.__file__).resolve().parent
ENTRIES = (CK.DATA_INFO, CK.GRAPH_TOKEN, CK.PROVENANCE, CK.LM)


def literals(path: Path) -> set[str]:
    return {n.value for n in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
            if isinstance(n, ast.Constant) and isinstance(n.value, str)}


def test_the_entries_are_distinct_and_the_packages_own():
    assert len(set(ENTRIES)) == 4 and all(e.startswith("qgmem_") for e in ENTRIES)
    assert (CK.NET_PREFIX, CK.LM_PREFIX) == ("net.", "lm.")


def test_no_other_module_spells_an_entry():
    spelled = {p.relative_to(ROOT).as_posix(): literals(p) & {*ENTRIES, CK.NET_PREFIX, CK.LM_PREFIX}
               for p in ROOT.rglob("*.py") if p != ROOT / "model" / "checkpoint_keys.py"}
    assert {k: v for k, v in spelled.items() if v} == {}


def test_training_writes_and_export_reads_through_the_names():
    for module in ("training/module.py", "export.py"):
        source = (ROOT / module).read_text(encoding="utf-8")
        assert "checkpoint_keys as CK" in source and "CK.GRAPH_TOKEN" in source and "CK.DATA_INFO" in source, module
