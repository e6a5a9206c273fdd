"""One entry point for every data set: ``load_cases("convomem" | "locomo" | "longmemeval", path)``.

Later stages call only this, so adding a data set means adding a module and a line in ``LOADERS``.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from qgmem.data._common import DEFAULT_MAX_TURN_CHARS, LoadedData
from qgmem.data.convomem import load_convomem
from qgmem.data.locomo import load_locomo
from qgmem.data.longmemeval import load_longmemeval
from qgmem.settings_flags import add_settings_arguments, settings_from_args

__all__ = ["DATASETS", "LOADERS", "LoadedData", "LoadingSettings", "add_load_arguments", "load_arguments", "load_cases"]

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


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


@dataclass
class LoadingSettings:
    """How a data-reading command loads its data set: the same flags on each, named as ``load_cases``' keywords."""

    #: stop at the first bad record, naming its file, item and field (default)
    strict: bool = field(default=True, metadata={
        "off_flag": "lenient", "off_help": "skip bad records, count them and list each reason"})
    #: cut a longer turn at N characters, counted in the report
    max_turn_chars: int = field(default=DEFAULT_MAX_TURN_CHARS, metadata={"type": _positive_int, "metavar": "N"})


def add_load_arguments(parser: argparse.ArgumentParser) -> None:
    """``--strict`` (default) / ``--lenient`` and ``--max-turn-chars``: :class:`LoadingSettings` as flags.

    Pass them on with ``load_cases(dataset, path, **load_arguments(args))``.
    """
    add_settings_arguments(parser, LoadingSettings)


def load_arguments(args: argparse.Namespace) -> dict[str, Any]:
    """The ``load_cases`` keywords set by :func:`add_load_arguments`."""
    return asdict(settings_from_args(LoadingSettings, args))
