"""``qgmem`` command line: one subcommand per stage, each defined next to the code it drives.

Each subcommand module exposes ``add_arguments(parser)`` and ``run(args) -> int``; modules are imported
lazily so ``qgmem --help`` stays fast and a stage's heavy imports load only when it runs.

A user's error (a :class:`~qgmem.errors.UserError`, or a missing / wrong-kind path from the OS) prints
one line ``qgmem COMMAND: error: ...`` and exits 2 with no traceback; ``--debug`` (anywhere on the
line) prints the traceback as well. Any other exception is a bug and keeps its traceback. The
convention is :func:`qgmem.errors.run_command`'s, so every entry point shares it; this module is the
table of subcommands and the dispatch to them, nothing else.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from qgmem import __version__
from qgmem.errors import DEBUG_FLAG, USER_ERROR_EXIT, argparse_command, run_command, split_debug

# name -> (module, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "data-stats": ("qgmem.data.stats", "Count cases, sessions, turns, QAs and evidence mapping of a data set."),
    "build-memory": ("qgmem.memory.build_cli", "Build per-dialogue memory stores (units, traces, embeddings)."),
    "eval-retrieval": ("qgmem.evaluation.retrieval", "Evaluate activation against gold evidence, beside a BM25 baseline."),
    "train-reranker": ("qgmem.reranker_training", "Train a cross-encoder reranker on ConvoMem's training split."),
    "build-cache": ("qgmem.training.build_cache", "Build a config's training cache (whole, one --shard I/N, or every torchrun/SLURM rank)."),
    "graph-stats": ("qgmem.samples.graph_stats", "Speech-verb edges, long nodes, hub share and top predicates of cached graphs."),
    "export": ("qgmem.export", "Export a trained checkpoint's graph encoder + projector for serving."),
    "answer": ("qgmem.serving.answer_cli", "Answer questions about a dialogue history with an export."),
    "eval-qa": ("qgmem.evaluation.eval_qa", "Evaluate an export's answers per category, one row per graph mode."),
    "serve": ("qgmem.serving.serve_cli", "Serve an export over HTTP: per-user memories, answers, OpenAI-compatible chat."),
    "migrate-store": ("qgmem.serving.migrate_store", "Move an earlier version's memory folders into a store database (SQLite or Postgres)."),
    "mcp": ("qgmem.serving.mcp_cli", "Serve an export's memory as MCP tools on stdio (remember, search, answer, list, forget)."),
}

#: training stages through LightningCLI, which parses its own arguments: name -> one-line help
TRAINING_COMMANDS: dict[str, str] = {
    "fit": "Train the graph token (--config FILE|PRESET); `python train.py` runs the whole job.",
    "validate": "Validate a checkpoint (--ckpt_path) without retraining.",
    "test": "Test a checkpoint (--ckpt_path) without retraining; writes test_predictions.jsonl.",
}


def main(argv: list[str] | None = None) -> int:
    from qgmem.omp import prefer_passive_waiting

    prefer_passive_waiting()  # before a subcommand imports torch
    argv, debug = split_debug(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(prog="qgmem", description=__doc__.splitlines()[0],
                                     epilog=f"{DEBUG_FLAG}: show the traceback of an error (any command)")
    parser.add_argument("--version", action="version", version=f"qgmem {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, help_text in [*((n, h) for n, (_, h) in COMMANDS.items()), *TRAINING_COMMANDS.items()]:
        sub.add_parser(name, help=help_text, add_help=False)
    if not argv or argv[0] in ("-h", "--help"):
        parser.print_help()
        return 0
    if argv[0] == "--version":
        print(f"qgmem {__version__}")
        return 0
    if argv[0] in TRAINING_COMMANDS:
        from qgmem.training.cli import run_subcommand

        return run_command(f"qgmem {argv[0]}", run_subcommand, argv, debug)
    if argv[0] not in COMMANDS:
        try:
            parser.parse_args(argv)  # prints the usage and the choices, exits 2
        except SystemExit as exc:
            return int(exc.code or 0)
        return USER_ERROR_EXIT
    name = argv[0]
    prog = f"qgmem {name}"
    module_name, help_text = COMMANDS[name]

    def command(rest: list[str]) -> int:
        module = importlib.import_module(module_name)  # inside the convention, as the command's own code
        if not hasattr(module, "add_arguments"):  # a command with its own (jsonargparse) parser
            return module.run(rest)
        return argparse_command(prog, help_text, module.add_arguments, module.run)(rest)

    return run_command(prog, command, argv[1:], debug)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
