"""Every column of a training row is read by the product: training, export, serving or the build that makes it.

A study's instruments (a second graph per question, what an ablation removed) once lived in the training
row and bumped the cache format for the study alone. Now they live in the study's own table
(:mod:`qgmem.evaluation.counterfactuals`). This test keeps it so: each column of the filtered splits'
schema must be read, by name, somewhere in the product's reading code (a ``row["name"]`` or
``row.get("name")`` in the modules below), or be one of the few provenance columns named here with why.
A column read only by ``qgmem.evaluation`` or a bench script fails.
"""

from __future__ import annotations

import ast
from pathlib import Path

import qgmem
from qgmem.samples import cache as C

ROOT = Path(qgmem.__file__).resolve().parent
#: the modules that read training rows: the row → item step and the build's filter (samples), the data
#: module, the training loop and records (training), the export, serving, and ``graph-stats`` (the
#: product's own look at a cache)
READERS = ("samples/cache.py", "samples/build.py", "samples/graph_stats.py", "samples/answer_filter.py",
           "training", "export.py", "serving")
#: written for a person reading a cache (where a row came from, what the filter decided), never read back
PROVENANCE = {
    "case_id": "the case the row was replayed from",
    "dialogue_id": "the dialogue of that case",
    "group": "the split group (person or dialogue) that no other split shares",
    "question_time": "the time the question was asked, as the data set gives it",
    "edge_unit": "the working-memory unit each edge came from",
    "lm_answer": "the frozen LM's answer the filter judged",
    "judged": "whether the filter judged that answer",
    "correct": "the filter's verdict on it",
}


def reader_files() -> list[Path]:
    out = []
    for name in READERS:
        path = ROOT / name
        out += sorted(path.rglob("*.py")) if path.is_dir() else [path]
    return out


def names_read(source: str) -> set[str]:
    """String keys read in ``source``: ``x["key"]`` (loaded, not assigned) and ``x.get("key", ...)``."""
    read = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load) \
                and isinstance(node.slice, ast.Constant) and isinstance(node.slice.value, str):
            read.add(node.slice.value)
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get" \
                and node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str):
            read.add(node.args[0].value)
    return read


def unread_columns(columns, sources) -> set[str]:
    read = set().union(*(names_read(s) for s in sources))
    return set(columns) - read - set(PROVENANCE)


def test_every_column_of_a_training_row_is_read_by_the_product():
    sources = [p.read_text(encoding="utf-8") for p in reader_files()]
    assert unread_columns(C.final_features(), sources) == set()


def test_a_study_only_column_would_fail():
    """Negative control: a column that only the study reads is found, whatever reads it outside the product."""
    sources = [p.read_text(encoding="utf-8") for p in reader_files()]
    study = 'graph = row["ablated_x"]\nunits = row.get("sham_units", 0)\n'  # as a study module would read them
    assert names_read(study) == {"ablated_x", "sham_units"}
    assert unread_columns([*C.final_features(), "ablated_x", "sham_units"], sources) == {"ablated_x", "sham_units"}


def test_names_read_sees_reads_only():
    source = 'row["a"]\nrow.get("b", 0)\nrow["c"] = 1\n{"d": 1}\nf("e")\n'
    assert names_read(source) == {"a", "b"}


def test_provenance_names_columns_of_the_row():
    assert set(PROVENANCE) <= set(C.final_features())
