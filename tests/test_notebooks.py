"""The notebooks stay valid (nbformat-4, code compiles against the API) and run: nbclient executes them."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

NOTEBOOKS_DIR = Path(__file__).resolve().parents[1] / "notebooks"
NOTEBOOKS = sorted(NOTEBOOKS_DIR.glob("*.ipynb"))


def test_notebooks_exist():
    assert {p.name for p in NOTEBOOKS} >= {"explore_memory.ipynb", "training_curves.ipynb"}


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_code_compiles_and_imports_resolve(path):
    import importlib

    notebook = json.loads(path.read_text(encoding="utf-8"))
    assert notebook["nbformat"] == 4
    code = ["".join(c["source"]) for c in notebook["cells"] if c["cell_type"] == "code"]
    assert code, f"{path.name} has no code cells"
    for source in code:
        tree = ast.parse(source)
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("qgmem"):
                module = importlib.import_module(node.module)
                for alias in node.names:
                    assert hasattr(module, alias.name), f"{path.name}: {node.module} has no {alias.name}"


def execute(path: Path) -> list[dict]:
    """Run every cell in a fresh kernel started in notebooks/ (as Jupyter would); return the code cells."""
    import nbformat
    from nbclient import NotebookClient

    notebook = nbformat.read(path, as_version=4)
    NotebookClient(notebook, timeout=600, kernel_name="python3",
                   resources={"metadata": {"path": str(path.parent)}}).execute()
    return [cell for cell in notebook.cells if cell.cell_type == "code"]


def text_of(cells: list[dict]) -> str:
    return "".join(o.get("text", "") for cell in cells for o in cell.get("outputs", []) if o["output_type"] == "stream")


def figures(cells: list[dict]) -> int:
    return sum("image/png" in o.get("data", {}) for cell in cells for o in cell.get("outputs", []))


def test_explore_memory_draws_the_local_graph_beside_the_working_memory():
    cells = execute(NOTEBOOKS_DIR / "explore_memory.ipynb")
    out = text_of(cells)
    assert "[M1]" in out and "nodes," in out and "edges" in out
    assert figures(cells) == 1


@pytest.fixture(scope="module")
def token_and_text_only_runs(tmp_path_factory):
    """A graph-token run with a text-only run inside it, as the notebook's markdown suggests."""
    from qgmem.model.random_lm import save_random_lm
    from qgmem.job import main
    from training.test_train_cli import TinyData, tiny_args

    tmp = tmp_path_factory.mktemp("runs")
    lm = str(save_random_lm(tmp / "lm", hidden_size=32, layers=2))
    main(tiny_args(tmp / "run", lm), datamodule_class=TinyData)
    main(tiny_args(tmp / "run" / "none", lm, "--model.graph_mode", "none"), datamodule_class=TinyData)
    return tmp / "run"


def test_training_curves_plots_token_against_text_only(token_and_text_only_runs, monkeypatch):
    monkeypatch.setenv("RUN_DIR", str(token_and_text_only_runs))
    cells = execute(NOTEBOOKS_DIR / "training_curves.ipynb")
    out = text_of(cells)
    metrics = json.loads((token_and_text_only_runs / "metrics.json").read_text())
    assert f"token     .                        best val/nll {metrics['best_score']:.4f}" in out
    assert "\nnone      none " in out and "no text-only run" not in out
    assert "   user_evidence " in out and "Q: 'Which color marks hot leads?'" in out
    assert figures(cells) == 2  # NLL curves, test EM/F1 bars


def test_training_curves_asks_for_the_text_only_run_when_only_train_py_ran(token_and_text_only_runs, tmp_path,
                                                                          monkeypatch):
    import shutil

    only = tmp_path / "checkpoints"
    shutil.copytree(token_and_text_only_runs, only, ignore=shutil.ignore_patterns("none"))
    monkeypatch.setenv("RUN_DIR", str(only))
    out = text_of(execute(NOTEBOOKS_DIR / "training_curves.ipynb"))
    assert "no text-only run under RUN_DIR yet" in out and "\nnone " not in out
