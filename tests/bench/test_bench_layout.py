"""bench/ stays a shelf with labels: every script named, every named script there, plain imports, no circle.

bench/ grew once into a flat folder of 41 scripts, 18 named by no BENCHMARKS section, importing each
other after `sys.path` inserts and in a circle. Each topic folder's README now names its scripts and
the section each feeds; these checks keep it so:

- every script in bench/ is named by its folder's README or by a command of docs/BENCHMARKS.md;
- every bench script a page names (docs/BENCHMARKS.md, the other docs/*.md pages, README.md, a bench
  README) exists, and a bench README's links resolve (BENCHMARKS.md sections by their anchors);
- no bench file edits `sys.path` (or a `PYTHONPATH` naming a bench folder) or imports a sibling script
  by its bare name: scripts run as `python -m bench.<topic>.<script>` and import `bench.…`;
- the bench modules import each other without a circle.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT_SUFFIXES = (".py", ".sh", ".yaml")
NOT_SCRIPTS = ("__init__.py",)

NAMED_PATH = re.compile(r"(?<![\w/.])(bench/[\w/]+\.(?:py|sh|yaml))\b")
NAMED_MODULE = re.compile(r"python -m (bench(?:\.\w+)+)")
README_NAME = re.compile(r"`([\w.]+\.(?:py|sh|yaml))`")
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def scripts(root: Path) -> list[Path]:
    return sorted(p for p in (root / "bench").rglob("*")
                  if p.is_file() and p.suffix in SCRIPT_SUFFIXES and p.name not in NOT_SCRIPTS)


def pages(root: Path) -> list[Path]:
    return [root / "README.md", *sorted((root / "docs").glob("*.md"))]


def named_paths(text: str) -> set[str]:
    """Repository paths of the bench scripts a text names: as a path, or as a `python -m` module."""
    return set(NAMED_PATH.findall(text)) | {m.replace(".", "/") + ".py" for m in NAMED_MODULE.findall(text)}


def readme_names(folder: Path) -> set[str]:
    readme = folder / "README.md"
    return set(README_NAME.findall(readme.read_text(encoding="utf-8"))) if readme.exists() else set()


def orphans(root: Path) -> list[str]:
    """Scripts in bench/ that neither their folder's README nor a docs/BENCHMARKS.md command names."""
    benchmarks = named_paths((root / "docs" / "BENCHMARKS.md").read_text(encoding="utf-8"))
    return [p.relative_to(root).as_posix() for p in scripts(root)
            if p.name not in readme_names(p.parent) and p.relative_to(root).as_posix() not in benchmarks]


def slug(title: str) -> str:
    """The anchor GitHub gives a heading: lower case, punctuation dropped, spaces as hyphens."""
    return re.sub(r"[^\w\- ]", "", title.strip().lower()).replace(" ", "-")


def missing_scripts(root: Path) -> list[str]:
    """Bench scripts that a page names but bench/ does not hold, and bench README links that do not resolve."""
    problems = []
    for page in pages(root):
        text = page.read_text(encoding="utf-8")
        problems += [f"{page.relative_to(root)}: {p}" for p in sorted(named_paths(text)) if not (root / p).is_file()]
    for readme in sorted((root / "bench").rglob("README.md")):
        where = readme.relative_to(root)
        text = readme.read_text(encoding="utf-8")
        problems += [f"{where}: {n}" for n in sorted(README_NAME.findall(text)) if not (readme.parent / n).is_file()]
        for target in LINK.findall(text):
            path, _, anchor = target.partition("#")
            file = (readme.parent / path).resolve()
            if not file.exists():
                problems.append(f"{where}: link {target}")
            elif anchor and anchor not in {slug(h) for h in re.findall(r"^#+ (.+)$", file.read_text(encoding="utf-8"),
                                                                          flags=re.M)}:
                problems.append(f"{where}: link {target} (no such section)")
    return problems


def module_name(path: Path, root: Path) -> str:
    return ".".join(path.relative_to(root).with_suffix("").parts).removesuffix(".__init__")


def path_edits(root: Path) -> list[str]:
    """Bench files that edit the import path or import a sibling script by its bare name."""
    stems = {p.stem for p in scripts(root) if p.suffix == ".py"}
    found = []
    for p in sorted((root / "bench").rglob("*")):
        if not p.is_file() or p.suffix not in (".py", ".sh"):
            continue
        text, where = p.read_text(encoding="utf-8"), p.relative_to(root).as_posix()
        if "sys.path" in text or re.search(r"PYTHONPATH=[^\n]*bench", text):
            found.append(f"{where}: edits the import path")
        if p.suffix == ".py":
            for node in ast.walk(ast.parse(text)):
                names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                         else [node.module] if isinstance(node, ast.ImportFrom) and node.module and not node.level
                         else [])
                found += [f"{where}: imports {n} by its bare name" for n in names if n.split(".")[0] in stems]
    return found


def import_graph(root: Path) -> dict[str, set[str]]:
    """Each bench module -> the bench modules it imports (anywhere in the file, function bodies too)."""
    modules = {module_name(p, root): p for p in (root / "bench").rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, p in modules.items():
        edges = set()
        for node in ast.walk(ast.parse(p.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                targets = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            else:
                continue
            edges |= {t for t in targets if t in modules and t != name and not modules[t].name == "__init__.py"}
        graph[name] = edges
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every import circle, once, as the modules along it (depth-first search)."""
    found, state = [], {}

    def visit(node: str, path: list[str]) -> None:
        state[node] = "open"
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == "open":
                found.append(path[path.index(nxt):] + [nxt])
            elif nxt not in state:
                visit(nxt, path + [nxt])
        state[node] = "done"

    for node in sorted(graph):
        if node not in state:
            visit(node, [node])
    return found


def test_every_bench_script_is_named_by_its_readme_or_a_benchmarks_command() -> None:
    assert orphans(ROOT) == []


def test_every_named_bench_script_exists() -> None:
    assert missing_scripts(ROOT) == []


def test_no_bench_file_edits_the_import_path() -> None:
    assert path_edits(ROOT) == []


def test_bench_modules_import_each_other_without_a_circle() -> None:
    graph = import_graph(ROOT)
    assert "bench.common" in graph["bench.activation.per_question"]  # the scan sees the imports it guards
    assert circles(graph) == []


def test_the_checks_find_an_orphan_a_bad_command_a_path_edit_and_a_circle(tmp_path: Path) -> None:
    (tmp_path / "docs").mkdir()
    (tmp_path / "README.md").write_text("Run `bash bench/t/run.sh`.\n")
    (tmp_path / "docs" / "BENCHMARKS.md").write_text(
        "# Benchmarks\n\n## Timing\n\n**Command**: `python -m bench.t.named --x 1`; `python -m bench.t.gone`.\n")
    t = tmp_path / "bench" / "t"
    t.mkdir(parents=True)
    (tmp_path / "bench" / "__init__.py").write_text("")
    (t / "__init__.py").write_text("")
    (t / "README.md").write_text("| `a.py` | [Timing](../../docs/BENCHMARKS.md#timing) |\n"
                                 "| `b.py` | [Speed](../../docs/BENCHMARKS.md#speed) |\n| `missing.py` | |\n")
    (t / "named.py").write_text("")
    (t / "a.py").write_text("def f():\n    from bench.t import b\n")
    (t / "b.py").write_text("import sys\nsys.path.insert(0, 'x')\nfrom bench.t.a import f\nfrom named import x\n")
    (t / "orphan.py").write_text("")
    assert orphans(tmp_path) == ["bench/t/orphan.py"]
    assert missing_scripts(tmp_path) == ["README.md: bench/t/run.sh", "docs/BENCHMARKS.md: bench/t/gone.py",
                                         "bench/t/README.md: missing.py",
                                         "bench/t/README.md: link ../../docs/BENCHMARKS.md#speed (no such section)"]
    assert path_edits(tmp_path) == ["bench/t/b.py: edits the import path", "bench/t/b.py: imports named by its bare name"]
    assert circles(import_graph(tmp_path)) == [["bench.t.a", "bench.t.b", "bench.t.a"]]
    assert slug("The whole job: `python train.py`") == "the-whole-job-python-trainpy"
