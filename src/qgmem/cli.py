"""``qgmem`` command line: one subcommand per stage, each defined next to the code it drives.

Each subcommand module exposes ``add_arguments(parser)`` and ``run(args) -> int``; modules are imported
lazily so ``qgmem --help`` stays fast and a stage's heavy imports load only when it runs.
"""

from __future__ import annotations

import argparse
import importlib
import sys

# name -> (module, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "data-stats": ("qgmem.data.stats", "Count cases, sessions, turns, QAs and evidence mapping of a data set."),
    "build-memory": ("qgmem.memory.build", "Build per-dialogue memory stores (units, traces, embeddings)."),
    "eval-retrieval": ("qgmem.activation.evaluate", "Evaluate activation against gold evidence, beside a BM25 baseline."),
    "graph-stats": ("qgmem.training.graph_stats", "Speech-verb edges, long nodes, hub share and top predicates of cached graphs."),
    "export": ("qgmem.export", "Export a trained checkpoint's graph encoder + projector for serving."),
}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(prog="qgmem", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (_, help_text) in COMMANDS.items():
        sub.add_parser(name, help=help_text, add_help=False)
    if not argv or argv[0] in ("-h", "--help") or argv[0] not in COMMANDS:
        parser.print_help() if not argv or argv[0] in ("-h", "--help") else parser.parse_args(argv)
        return 0 if not argv or argv[0] in ("-h", "--help") else 2
    name = argv[0]
    module = importlib.import_module(COMMANDS[name][0])
    cmd_parser = argparse.ArgumentParser(prog=f"qgmem {name}", description=COMMANDS[name][1])
    module.add_arguments(cmd_parser)
    args = cmd_parser.parse_args(argv[1:])
    return int(module.run(args) or 0)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
