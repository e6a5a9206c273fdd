"""``qgmem`` command line: one subcommand per stage, each defined next to the code it drives.

Each subcommand module exposes ``add_arguments(parser)`` and ``run(args) -> int``; modules are imported
lazily so ``qgmem --help`` stays fast and a stage's heavy imports load only when it runs.

A user's error (a :class:`~qgmem.errors.UserError`, or a missing / wrong-kind path from the OS) prints
one line ``qgmem COMMAND: error: ...`` and exits 2 with no traceback; ``--debug`` (anywhere on the
line) prints the traceback as well. Any other exception is a bug and keeps its traceback.
"""

from __future__ import annotations

import argparse
import importlib
import sys
import traceback

from qgmem.errors import USER_ERROR_EXIT, UserError

# name -> (module, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "data-stats": ("qgmem.data.stats", "Count cases, sessions, turns, QAs and evidence mapping of a data set."),
    "build-memory": ("qgmem.memory.build", "Build per-dialogue memory stores (units, traces, embeddings)."),
    "eval-retrieval": ("qgmem.activation.evaluate", "Evaluate activation against gold evidence, beside a BM25 baseline."),
    "train-reranker": ("qgmem.activation.train_reranker", "Train a cross-encoder reranker on ConvoMem's training split."),
    "build-cache": ("qgmem.training.cache_cli", "Build a config's training cache (whole, one --shard I/N, or every torchrun/SLURM rank)."),
    "graph-stats": ("qgmem.training.graph_stats", "Speech-verb edges, long nodes, hub share and top predicates of cached graphs."),
    "export": ("qgmem.export", "Export a trained checkpoint's graph encoder + projector for serving."),
    "answer": ("qgmem.serving.answer_cli", "Answer questions about a dialogue history with an export."),
    "eval-qa": ("qgmem.serving.eval_qa", "Evaluate an export's answers per category, one row per graph mode."),
}

#: training stages through LightningCLI, which parses its own arguments: name -> one-line help
TRAINING_COMMANDS: dict[str, str] = {
    "fit": "Train the graph token (--config FILE|PRESET); `python train.py` runs the whole job.",
    "validate": "Validate a checkpoint (--ckpt_path) without retraining.",
    "test": "Test a checkpoint (--ckpt_path) without retraining; writes test_predictions.jsonl.",
}

#: OS errors that, reaching the command line, mean the user named a wrong path (their message names it)
PATH_ERRORS = (FileNotFoundError, IsADirectoryError, NotADirectoryError, PermissionError)
DEBUG_FLAG = "--debug"


def _print_error(prog: str, exc: BaseException, debug: bool) -> int:
    if debug:
        traceback.print_exception(exc)
    message = str(exc) or type(exc).__name__
    print(f"{prog}: error: {message}", file=sys.stderr)
    if not debug:
        print(f"{prog}: (run again with {DEBUG_FLAG} for the traceback)", file=sys.stderr)
    return USER_ERROR_EXIT


def run_command(prog: str, command, argv: list[str], debug: bool = False) -> int:
    """Run ``command(argv)`` under the user-error convention; reusable by entry points outside ``COMMANDS``."""
    try:
        return int(command(argv) or 0)
    except (UserError, *PATH_ERRORS) as exc:
        return _print_error(prog, exc, debug)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = DEBUG_FLAG in argv
    argv = [a for a in argv if a != DEBUG_FLAG]
    parser = argparse.ArgumentParser(prog="qgmem", description=__doc__.splitlines()[0],
                                     epilog=f"{DEBUG_FLAG}: show the traceback of an error (any command)")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, help_text in [*((n, h) for n, (_, h) in COMMANDS.items()), *TRAINING_COMMANDS.items()]:
        sub.add_parser(name, help=help_text, add_help=False)
    if not argv or argv[0] in ("-h", "--help"):
        parser.print_help()
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

    def command(rest: list[str]) -> int:
        module = importlib.import_module(COMMANDS[name][0])
        cmd_parser = argparse.ArgumentParser(prog=prog, description=COMMANDS[name][1])
        module.add_arguments(cmd_parser)
        cmd_parser.add_argument(DEBUG_FLAG, action="store_true", help="show the traceback of an error")
        try:
            args = cmd_parser.parse_args(rest)
        except SystemExit as exc:  # --help (0) or a bad flag (2: argparse printed usage and the reason)
            return int(exc.code or 0)
        return module.run(args)

    return run_command(prog, command, argv[1:], debug)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
