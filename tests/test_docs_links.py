"""The README and the pages under docs/ point only at things that exist.

Three kinds of reference are checked, since each has gone stale when code moved:
- relative Markdown links and images (`[text](path#anchor)`), resolved from the page's folder;
- backticked repository paths (`bench/load.py`, `docs/serving.md`, `model/pretrained.py`), resolved
  from the repository root or from `src/qgmem/`; paths under a folder that `.gitignore` names (runs,
  caches, exports) are what a run writes, not what the repository holds, and are skipped;
- backticked dotted module names (`qgmem.evaluation.protocol`, `qgmem.job.main`): the longest prefix
  that is a module must exist, and at most one name after it must be defined at its top level.
"""

from __future__ import annotations

import ast
import re
from functools import lru_cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
CODE_SPAN = re.compile(r"(?<!`)`([^`\n]+)`(?!`)")
MODULE_NAME = re.compile(r"^qgmem(?:\.[A-Za-z_]\w*)+$")
PATH_LIKE = re.compile(r"^[\w.\-]+(?:/[\w.\-]+)*/?$")


def ignored_folders(root: Path) -> tuple[str, ...]:
    """Folder prefixes that `.gitignore` names (`checkpoints/*`, `data/cache/`): written by runs."""
    gitignore = root / ".gitignore"
    if not gitignore.exists():
        return ()
    folders = []
    for line in gitignore.read_text(encoding="utf-8").splitlines():
        line = line.strip()
        if not line or line.startswith(("#", "!", "*")):
            continue
        line = line.removesuffix("*").rstrip("/")
        if line and "*" not in line:
            folders.append(line.lstrip("/") + "/")
    return tuple(folders)


def is_repo_path(span: str, root: Path) -> bool:
    """A backticked span with a folder part whose first folder the repository or the package has."""
    if "/" not in span or not PATH_LIKE.match(span) or span.startswith(("-", ".")):
        return False
    first = span.split("/", 1)[0]
    return (root / first).exists() or (root / "src" / "qgmem" / first).is_dir()


@lru_cache(maxsize=None)
def top_level_names(module_file: Path) -> frozenset[str]:
    tree = ast.parse(module_file.read_text(encoding="utf-8"))
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                names.update(n.id for n in ast.walk(target) if isinstance(n, ast.Name))
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
    return frozenset(names)


def module_name_problem(name: str, src: Path) -> str | None:
    """Why `qgmem.a.b.name` does not resolve under `src`, or None when it does."""
    parts = name.split(".")
    for cut in range(len(parts), 0, -1):
        base = src.joinpath(*parts[:cut])
        module_file = base / "__init__.py" if base.is_dir() else base.with_suffix(".py")
        if not module_file.exists():
            continue
        rest = parts[cut:]
        if not rest:
            return None
        if len(rest) == 1 and rest[0] in top_level_names(module_file):
            return None
        return f"{'.'.join(parts[:cut])} defines no top-level {'.'.join(rest)}"
    return "no such module"


def broken_references(page: Path, root: Path) -> list[str]:
    """Every reference of `page` that does not resolve, as `page: reference (why)`."""
    text = page.read_text(encoding="utf-8")
    text = re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)  # command examples, not references
    problems = []
    where = page.relative_to(root) if page.is_relative_to(root) else page.name
    for target in LINK.findall(text):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target) or target.startswith("#"):
            continue
        path = target.split("#", 1)[0]
        if not (page.parent / path).exists():
            problems.append(f"{where}: link {target} (no such file)")
    skipped = ignored_folders(root)
    src = root / "src"
    for span in CODE_SPAN.findall(text):
        span = span.strip().split("::", 1)[0]  # a test's file, without the test's name
        if MODULE_NAME.match(span):
            why = module_name_problem(span, src)
            if why:
                problems.append(f"{where}: {span} ({why})")
            continue
        if not is_repo_path(span, root):
            continue
        if any((span.rstrip("/") + "/").startswith(folder) for folder in skipped):
            continue
        if not ((root / span).exists() or (root / "src" / "qgmem" / span).exists()):
            problems.append(f"{where}: {span} (no such path)")
    return problems


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_link_path_and_module_of_the_page_resolves(page: Path) -> None:
    assert broken_references(page, ROOT) == []


def test_the_checker_finds_each_kind_of_broken_reference(tmp_path: Path) -> None:
    (tmp_path / "src" / "qgmem" / "evaluation").mkdir(parents=True)
    (tmp_path / "src" / "qgmem" / "__init__.py").write_text("")
    (tmp_path / "src" / "qgmem" / "evaluation" / "__init__.py").write_text("")
    (tmp_path / "src" / "qgmem" / "evaluation" / "protocol.py").write_text("def run_seed():\n    pass\n")
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "real.md").write_text("# Real\n")
    (tmp_path / "bench").mkdir()
    (tmp_path / "tests").mkdir()
    (tmp_path / "bench" / "load.py").write_text("")
    (tmp_path / ".gitignore").write_text("checkpoints/*\ndata/cache/\n")
    good = tmp_path / "docs" / "good.md"
    good.write_text(
        "See [real](real.md#real), [web](https://example.org/x), [here](#top), `bench/load.py`,\n"
        "`evaluation/protocol.py`, `qgmem.evaluation.protocol`, `qgmem.evaluation.protocol.run_seed`,\n"
        "`checkpoints/export`, `data/cache/`, `--trainer.max_steps 200`, `a/b` words,\n"
        "`bench/load.py::test_x`.\n"
        "```\nmissing/inside/a/block.py\n```\n"
    )
    bad = tmp_path / "docs" / "made_up.md"
    bad.write_text(
        "[gone](gone.md), ![plot](plot.png), `bench/missing.py`, `evaluation/eval.py`,\n"
        "`qgmem.training.protocol`, `qgmem.evaluation.protocol.no_such_name`,\n"
        "`tests/gone.py::test_x`\n"
    )
    assert broken_references(good, tmp_path) == []
    assert broken_references(bad, tmp_path) == [
        "docs/made_up.md: link gone.md (no such file)",
        "docs/made_up.md: link plot.png (no such file)",
        "docs/made_up.md: bench/missing.py (no such path)",
        "docs/made_up.md: evaluation/eval.py (no such path)",
        "docs/made_up.md: qgmem.training.protocol (qgmem defines no top-level training.protocol)",
        "docs/made_up.md: qgmem.evaluation.protocol.no_such_name "
        "(qgmem.evaluation.protocol defines no top-level no_such_name)",
        "docs/made_up.md: tests/gone.py (no such path)",
    ]
