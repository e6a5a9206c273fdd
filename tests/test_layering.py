"""The rules of the house (docs/ARCHITECTURE.md), checked on the import graph of the installed package.

Every module under ``qgmem`` is parsed with ``ast``; each ``import`` / ``from … import`` naming a qgmem
module (at the top or inside a function: a lazy import is still a dependency) is an edge. The graph
must have no cycles, no module may import a layer above its own, and serving and model never import
training.
"""

from __future__ import annotations

import ast
import graphlib
from pathlib import Path

import pytest

import qgmem

#: the import order, lowest first: a module may import its own layer and any layer below it. The first
#: layer is the ground floor, one rule each, importable by anyone. ``model`` (the networks and the empty
#: graph) sits below ``activation``; ``export`` sits above ``training`` (an export is read with model code
#: only). ``reranker_training`` trains an activation component with another framework, reading the
#: training preset's split. ``evaluation`` measures the product and sits on top of it, beside ``job``
#: (``python train.py``'s whole job) and the command line. ``qgmem`` is the package's own ``__init__``;
#: ``__main__`` runs the command line.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("qgmem", "errors", "ranks", "integrity", "timeexpr", "finite", "lm", "embed", "configs", "text", "prompting",
     "provenance", "omp", "older_records", "settings_flags"),
    ("data",),
    ("llm",),
    ("memory",),
    ("model",),
    ("activation",),
    ("samples",),
    ("training",),
    ("export",),
    ("serving", "reranker_training"),
    ("client",),
    ("evaluation",),
    ("job", "cli", "__main__"),
)
#: units that never import training, whatever the order allows
NEVER_IMPORT_TRAINING = ("serving", "model", "export")
#: units outside the product: nothing of the product may import them
NOT_THE_PRODUCT = ("evaluation", "job", "cli", "__main__")


def module_name(path: Path, root: Path, package: str) -> str:
    parts = [package, *path.relative_to(root).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph(root: Path, package: str = "qgmem") -> dict[str, set[str]]:
    """``module -> the package's modules it imports`` for every ``.py`` file under ``root``."""
    files = {module_name(p, root, package): p for p in sorted(root.rglob("*.py"))}
    graph: dict[str, set[str]] = {}
    for name, path in files.items():
        here = name if path.name == "__init__.py" else name.rpartition(".")[0]
        targets: list[str] = []
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
            if isinstance(node, ast.Import):
                targets += [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = here.split(".")[: len(here.split(".")) - node.level + 1]
                    source = ".".join(base + ([node.module] if node.module else []))
                else:
                    source = node.module or ""
                # `from pkg import sub` imports pkg and, where ``sub`` is a module, pkg.sub
                targets += [source, *(f"{source}.{alias.name}" for alias in node.names)]
        edges = set()
        for target in targets:
            if target.split(".")[0] != package:
                continue
            while target and target not in files:  # `qgmem.x.y.Name` -> the module qgmem.x.y
                target = target.rpartition(".")[0]
            if target and target != name:
                edges.add(target)
        graph[name] = edges
    return graph


def unit(module: str) -> str:
    """The subpackage or top-level module a module belongs to (``qgmem.samples.build`` -> ``samples``)."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def layer_of(name: str) -> int:
    for index, names in enumerate(LAYERS):
        if name in names:
            return index
    raise KeyError(name)


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    try:
        graphlib.TopologicalSorter(graph).prepare()
    except graphlib.CycleError as exc:
        return list(exc.args[1])
    return None


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    return sorted(f"{a} ({unit(a)}) imports {b} ({unit(b)})" for a, targets in graph.items() for b in targets
                  if layer_of(unit(b)) > layer_of(unit(a)))


def training_imports(graph: dict[str, set[str]]) -> list[str]:
    return sorted(f"{a} imports {b}" for a, targets in graph.items() for b in targets
                  if unit(a) in NEVER_IMPORT_TRAINING and unit(b) == "training")


@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
    return import_graph(Path(qgmem.__file__).parent)


def test_the_graph_sees_top_level_and_lazy_imports(graph):
    # positive controls: a top-level import and one inside a function are both edges
    assert "qgmem.samples.spec" in graph["qgmem.training.datamodule"]
    assert "qgmem.samples.build" in graph["qgmem.training.build_cache"]  # imported inside build_with_fabric
    assert "qgmem.training.cli" in graph["qgmem.cli"]  # imported inside main


def test_every_unit_has_a_layer(graph):
    assert sorted({unit(m) for m in graph} - {name for names in LAYERS for name in names}) == []


def test_no_import_cycles(graph):
    assert find_cycle(graph) is None


def test_nothing_imports_a_higher_layer(graph):
    assert upward_imports(graph) == []


def test_serving_and_model_never_import_training(graph):
    assert training_imports(graph) == []


def product_imports_of_evaluation(graph: dict[str, set[str]]) -> list[str]:
    return sorted(f"{a} imports {b}" for a, targets in graph.items() for b in targets
                  if unit(b) == "evaluation" and unit(a) not in NOT_THE_PRODUCT)


def test_the_product_never_imports_evaluation(graph):
    assert {"qgmem.evaluation.retrieval", "qgmem.evaluation.eval_qa", "qgmem.evaluation.bootstrap"} <= set(graph)
    assert product_imports_of_evaluation(graph) == []
    # negative control: an edge from the product into evaluation is found
    assert product_imports_of_evaluation({"qgmem.serving.x": {"qgmem.evaluation.bootstrap"}}) == \
        ["qgmem.serving.x imports qgmem.evaluation.bootstrap"]


def test_the_checks_catch_a_cycle_an_upward_import_and_training_from_serving(tmp_path):
    root = tmp_path / "qgmem"
    for folder, files in {"": {"errors.py": ""},
                          "data": {"a.py": "from qgmem.memory import b\n"},
                          "memory": {"b.py": "def f():\n    from ..data.a import x\n"},
                          "serving": {"s.py": "import qgmem.training.t\n"},
                          "training": {"t.py": "from qgmem.errors import UserError\n"}}.items():
        (root / folder).mkdir(parents=True, exist_ok=True)
        (root / folder / "__init__.py").write_text("")
        for name, text in files.items():
            (root / folder / name).write_text(text)
    bad = import_graph(root)
    assert bad["qgmem.memory.b"] == {"qgmem.data.a"}  # a relative import inside a function
    assert sorted(find_cycle(bad)[:-1]) == ["qgmem.data.a", "qgmem.memory.b"]
    assert upward_imports(bad) == ["qgmem.data.a (data) imports qgmem.memory (memory)",
                                   "qgmem.data.a (data) imports qgmem.memory.b (memory)"]
    assert training_imports(bad) == ["qgmem.serving.s imports qgmem.training.t"]
    # negative control: the same tree without the offending imports passes every check
    (root / "data" / "a.py").write_text("from qgmem.errors import UserError\n")
    (root / "serving" / "s.py").write_text("from qgmem.data import a\n")
    good = import_graph(root)
    assert (find_cycle(good), upward_imports(good), training_imports(good)) == (None, [], [])


def test_the_client_reads_only_the_request_and_reply_models(graph):
    """``qgmem.client`` runs where torch does not: of the product it imports the serving protocol alone
    (a torch-free module, checked by ``tests/serving/test_client.py`` in a fresh interpreter)."""
    client = {b for a, targets in graph.items() if unit(a) == "client" for b in targets if unit(b) != "client"}
    assert client == {"qgmem.serving.routes", "qgmem.serving.routes.protocol"}  # the package: a docstring
