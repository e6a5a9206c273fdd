"""K, the number of graph tokens, has one name in the code: ``num_graph_tokens``.

It used to be ``num_queries`` (network, module), ``num_tokens`` (a property) and ``graph_tokens``
(prompt settings, export record). The old names may appear only in comments and in the code that reads older files (``qgmem.older_records``,
the one home of those rules; ``RENAMED_*`` maps, lines marked ``legacy``).

The graph mode has one name too, ``graph_mode``: the second check keeps its older names out.
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


def test_k_has_one_name_in_the_package_and_the_benchmarks():
    assert offending_lines(SRC) == []
    assert offending_lines(SRC.parents[1] / "bench") == []  # the studies' records name it as the package does


def test_the_check_finds_an_old_name(tmp_path):  # positive control: the pattern catches each old form
    (tmp_path / "a.py").write_text("x = cfg.num_queries\nPromptSettings(graph_tokens=3)\nd['graph_tokens']\n"
                                   "k = net.config.num_tokens\ntokens = module.graph_tokens(batch)\n")
    assert [line.split(": ", 1)[0] for line in offending_lines(tmp_path)] == ["a.py:1", "a.py:2", "a.py:3", "a.py:4"]


#: the graph mode's older names, where a line shows it is the mode and not a graph object (its name is
#: ``graph_mode``; a graph, ``item["graph"]``, ``memory.graph``, a reply's nodes and edges, keeps ``graph``):
#: the pipeline's ``default_graph``, the module's hyperparameter ``graph`` (``hparams.graph``, read from a
#: checkpoint as ``hp.get("graph")``), ``graph=`` or ``"graph":`` given a mode, the flags ``--graph`` and
#: ``--model.graph``, and the export's ``answer_graph`` / ``trained_graph_mode``
MODES = r"(?:token|none|shuffled|ablated)"
OLD_GRAPH_MODE_NAMES = re.compile(
    r"\bdefault_graph\b|\bhparams\.graph\b(?!_)|\bhparams\[[\"']graph[\"']\]|\bhp\.get\([\"']graph[\"']"
    rf"|\bgraph\s*=\s*[\"']{MODES}[\"']|[\"'`]?\bgraph[\"'`]?\s*:\s*[\"'`]?{MODES}\b"
    r"|--graph\b(?![-\w])|\bmodel\.graph\b(?!_)|\banswer_graph\b|\btrained_graph_mode\b")
REPO = SRC.parents[1]
#: what the scan reads: the package, its presets, the benchmark scripts
SCANNED = ((SRC, "*.py"), (SRC, "*.yaml"), (REPO / "configs", "*.yaml"), (REPO / "bench", "*.py"))


def graph_mode_offences(root: Path, scanned=((Path("."), "*.py"), (Path("."), "*.yaml"))) -> list[str]:
    found = []
    for folder, pattern in scanned:
        for path in sorted((root / folder).rglob(pattern)):
            name = path.relative_to(root).as_posix()
            if path.name == "older_records.py":  # reads older records by their old names, by design
                continue
            for n, line in enumerate(path.read_text().splitlines(), 1):
                hit = OLD_GRAPH_MODE_NAMES.search(line)  # a comment may name an older record's field
                if hit and "legacy" not in line and not line.strip().startswith("#"):
                    found.append(f"{name}:{n}: {line.strip()}")
    return found


def test_the_graph_mode_s_older_names_are_gone():
    assert graph_mode_offences(REPO, tuple((folder.relative_to(REPO), pattern) for folder, pattern in SCANNED)) == []


def test_the_graph_mode_check_finds_an_older_name(tmp_path):  # positive control: each form, and what it leaves
    (tmp_path / "a.py").write_text(
        "mode = pipe.default_graph\n"                       # 1
        "mode = self.hparams.graph\n"                       # 2
        "mode = hp.get('graph', 'token')\n"                 # 3
        "pipe.answer(q, graph=\"none\")\n"                   # 4
        "body = {\"question\": q, \"graph\": \"token\"}\n"     # 5
        "argv = ['eval-qa', '--graph', 'token,none']\n"     # 6
        "train(['--model.graph', 'none'])\n"                # 7
        "cfg.get('answer_graph')\n"                         # 8
        "config['trained_graph_mode']\n"                    # 9
        "mode = pipe.contract.graph_mode\n"                 # today's names, and graphs, are left alone
        "tokens = batch['graph']; nodes = answer.graph['nodes']; mine = replace(r, graph=other.graph)\n"
        "argv = ['--graph-modes', 'token', '--graph-mode', 'none', '--graph-sizes', '--model.graph_mode']\n"
        "key = {'graph': 'none'}  # legacy: a cache key\n")
    (tmp_path / "b.yaml").write_text("model:\n  graph: none\n  graph_mode: none\n")
    assert [line.split(": ", 1)[0] for line in graph_mode_offences(tmp_path)] == [
        *(f"a.py:{n}" for n in range(1, 10)), "b.yaml:2"]
