"""One entry point for every data set: ``load_cases("convomem" | "locomo" | "longmemeval", path)``.

Later stages call only this, so adding a data set means adding a module and a line in ``LOADERS``.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path
from typing import Any

from qgmem.data._common import DEFAULT_MAX_TURN_CHARS, LoadedData
from qgmem.data.convomem import load_convomem
from qgmem.data.locomo import load_locomo
from qgmem.data.longmemeval import load_longmemeval

__all__ = ["DATASETS", "LOADERS", "LoadedData", "add_load_arguments", "load_arguments", "load_cases"]

LOADERS: dict[str, Callable[..., LoadedData]] = {
    "convomem": load_convomem,
    "locomo": load_locomo,
    "longmemeval": load_longmemeval,
}
DATASETS = tuple(LOADERS)


def load_cases(dataset: str, path: str | Path, *, strict: bool = True, **options: Any) -> LoadedData:
    """Load ``dataset`` from ``path`` into cases plus a report of what was read, skipped and mapped.

    ``strict`` (default) raises :class:`~qgmem.data.errors.DataFormatError` on the first bad record;
    ``strict=False`` skips bad records and lists each in ``report["skip_reasons"]``. ``options`` are
    the data set's own (ConvoMem: ``distractor_conversations``, ``seed``, ``fuzzy_threshold``; LoCoMo:
    ``adversarial_gold``) and, for all, ``max_turn_chars``; an unknown option is a ``TypeError``.
    """
    try:
        loader = LOADERS[dataset]
    except KeyError:
        raise ValueError(f"unknown dataset {dataset!r}; expected one of {', '.join(DATASETS)}") from None
    return loader(path, strict=strict, **options)


def add_load_arguments(parser: argparse.ArgumentParser) -> None:
    """``--strict`` (default) / ``--lenient``: the same loading policy flags on every data-reading command.

    Also ``--max-turn-chars`` (the cap on one turn's text). Pass both on with
    ``load_cases(dataset, path, **load_arguments(args))``.
    """
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--strict", dest="strict", action="store_true", default=True,
                      help="stop at the first bad record, naming its file, item and field (default)")
    mode.add_argument("--lenient", dest="strict", action="store_false",
                      help="skip bad records, count them and list each reason")
    parser.add_argument("--max-turn-chars", type=_positive_int, default=DEFAULT_MAX_TURN_CHARS, metavar="N",
                        help=f"cut a longer turn at N characters, counted in the report (default {DEFAULT_MAX_TURN_CHARS})")


def load_arguments(args: argparse.Namespace) -> dict[str, Any]:
    """The ``load_cases`` keywords set by :func:`add_load_arguments`."""
    return {"strict": args.strict, "max_turn_chars": args.max_turn_chars}


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value
