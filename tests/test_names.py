"""K, the number of graph tokens, has one name in the code: ``num_graph_tokens``.

It used to be ``num_queries`` (network, module), ``num_tokens`` (a property) and ``graph_tokens``
(prompt settings, export record). The old names may appear only in comments and in the code that reads older files (``qgmem.older_records``,
the one home of those rules; ``RENAMED_*`` maps, lines marked ``legacy``).
"""

from __future__ import annotations

import re
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "qgmem"
#: a setting, keyword, key or attribute named like K's old names (``graph_tokens(...)`` the method is fine)
OLD_NAMES = re.compile(r"\bnum_queries\b|[\"']graph_tokens[\"']|\bgraph_tokens\s*[=:](?!=)|\.graph_tokens\b(?!\()"
                       r"|\bconfig\.num_tokens\b")


def offending_lines(root: Path) -> list[str]:
    found = []
    for path in sorted(root.rglob("*.py")):
        if path.name == "older_records.py":  # reads older files by their old names, by design
            continue
        for n, line in enumerate(path.read_text().splitlines(), 1):
            code = line.strip()
            if OLD_NAMES.search(code) and not code.startswith("#") and "RENAMED" not in code and "legacy" not in code:
                found.append(f"{path.relative_to(root)}:{n}: {line.strip()}")
    return found


def test_k_has_one_name_in_the_package():
    assert offending_lines(SRC) == []


def test_the_check_finds_an_old_name(tmp_path):  # positive control: the pattern catches each old form
    (tmp_path / "a.py").write_text("x = cfg.num_queries\nPromptSettings(graph_tokens=3)\nd['graph_tokens']\n"
                                   "k = net.config.num_tokens\ntokens = module.graph_tokens(batch)\n")
    assert [line.split(": ", 1)[0] for line in offending_lines(tmp_path)] == ["a.py:1", "a.py:2", "a.py:3", "a.py:4"]


#: the graph mode's retired names (its name is ``graph_mode``; the pipeline reads it from its answer contract)
OLD_GRAPH_MODE_NAMES = re.compile(r"\bdefault_graph\b")


def graph_mode_offences(root: Path) -> list[str]:
    return [f"{path.relative_to(root)}:{n}: {line.strip()}" for path in sorted(root.rglob("*.py"))
            for n, line in enumerate(path.read_text().splitlines(), 1) if OLD_GRAPH_MODE_NAMES.search(line)]


def test_the_graph_mode_s_retired_names_are_gone():
    assert graph_mode_offences(SRC) == []


def test_the_graph_mode_check_finds_a_retired_name(tmp_path):  # positive control
    (tmp_path / "a.py").write_text("mode = pipe.default_graph\nmode = pipe.contract.graph_mode\n")
    assert [line.split(": ", 1)[0] for line in graph_mode_offences(tmp_path)] == ["a.py:1"]
