"""Plumbing shared by the loaders: reading JSON, checking fields, strict/lenient accounting.

Every check raises :class:`DataFormatError` naming the file, the item index and the field, so a bad
record in a 1 GB dump can be found without a debugger. In lenient mode the same error becomes a
counted skip in the load report instead of an exception.
"""

from __future__ import annotations

import json
import logging
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from qgmem.data.errors import DataFormatError, SkipReport
from qgmem.data.evidence import EvidenceCounts
from qgmem.data.records import Case

logger = logging.getLogger("qgmem.data")

_TYPE_NAMES = {str: "string", int: "integer", float: "number", list: "list", dict: "object", bool: "boolean"}


@dataclass
class LoadedData:
    """What a loader returns: the cases and a JSON-ready report of how they were read."""

    cases: list[Case]
    report: dict[str, Any] = field(default_factory=dict)


def read_json(path: Path, rel: str) -> Any:
    """Parse one JSON file; malformed JSON names the file, line and column."""
    try:
        with open(path, encoding="utf-8") as fh:
            return json.load(fh)
    except json.JSONDecodeError as exc:
        raise DataFormatError(f"malformed JSON: {exc.msg} (line {exc.lineno}, column {exc.colno})",
                              file=rel, field="<document>") from exc
    except UnicodeDecodeError as exc:
        raise DataFormatError(f"not UTF-8 text ({exc.reason} at byte {exc.start})", file=rel,
                              field="<document>") from exc


def need(obj: Any, key: str, types: type | tuple[type, ...], *, file: str, item: int | str | None,
         where: str = "", optional: bool = False, nullable: bool = False, default: Any = None) -> Any:
    """``obj[key]`` checked against ``types``; a missing key or a wrong type is a DataFormatError.

    ``where`` is the path of ``obj`` inside the item (e.g. ``conversations[2]``), so the error's field
    reads ``conversations[2].messages``.
    """
    name = f"{where}.{key}" if where else key
    if not isinstance(obj, dict):
        raise DataFormatError(f"expected an object, got {type(obj).__name__}", file=file, item=item,
                              field=where or "<item>")
    if key not in obj:
        if optional:
            return default
        raise DataFormatError("missing field", file=file, item=item, field=name)
    value = obj[key]
    if value is None and (nullable or optional):
        return default if optional and not nullable else None
    types_t = types if isinstance(types, tuple) else (types,)
    # bool is an int subclass in Python; a JSON true is never a valid count or answer
    if not isinstance(value, types_t) or (isinstance(value, bool) and bool not in types_t):
        expected = " or ".join(_TYPE_NAMES.get(t, t.__name__) for t in types_t)
        raise DataFormatError(f"expected {expected}, got {_json_type(value)}", file=file, item=item,
                              field=name)
    return value


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    return _TYPE_NAMES.get(type(value), type(value).__name__)


class LoadContext:
    """Strict/lenient policy plus the counters a loader reports (files, items, skips, evidence)."""

    def __init__(self, dataset: str, root: Path, strict: bool):
        self.dataset = dataset
        self.root = root
        self.strict = strict
        self.files_read: list[str] = []
        self.items = 0
        self.skips = SkipReport()
        self.evidence = EvidenceCounts()

    def rel(self, path: Path) -> str:
        """A path relative to the loaded root (what error messages and ``Case.source`` carry)."""
        try:
            rel = path.resolve().relative_to(self.root.resolve())
            return rel.as_posix() if str(rel) != "." else path.name
        except ValueError:
            return path.as_posix()

    def fail(self, error: DataFormatError) -> None:
        """Raise in strict mode; otherwise count the skip, log it, and carry on."""
        if self.strict:
            raise error
        self.skips.add(error)
        logger.warning("skipped: %s", error)

    def report(self, cases: list[Case], options: dict[str, Any]) -> dict[str, Any]:
        categories = Counter(qa.category for case in cases for qa in case.qas)
        return {
            "dataset": self.dataset,
            "path": self.root.as_posix(),
            "strict": self.strict,
            "options": options,
            "files_read": list(self.files_read),
            "items": self.items,
            "cases": len(cases),
            "qas": sum(len(c.qas) for c in cases),
            "skipped": len(self.skips),
            "skip_reasons": list(self.skips.skipped),
            "evidence": self.evidence.as_dict(),
            "categories": dict(sorted(categories.items())),
        }


def load_json_lists(dataset: str, path: str | Path, strict: bool, what: str, parse) -> tuple[LoadContext, list[Case]]:
    """Read a JSON file (or every ``*.json`` in a folder) whose top level is a list of ``what``.

    ``parse(raw, rel, index, ctx)`` turns one element into a ``Case``; a ``DataFormatError`` from it
    (or from reading a file) stops a strict load and is counted as a skip in a lenient one.
    """
    root = Path(path)
    if not root.exists():
        raise FileNotFoundError(f"no such file or folder: {root}")
    files = sorted(root.glob("*.json")) if root.is_dir() else [root]
    if not files:
        raise FileNotFoundError(f"no *.json files in {root}")
    ctx = LoadContext(dataset, root if root.is_dir() else root.parent, strict)
    cases: list[Case] = []
    for file in files:
        rel = ctx.rel(file)
        try:
            doc = read_json(file, rel)
            if not isinstance(doc, list):
                raise DataFormatError(f"expected a list of {what}, got {type(doc).__name__}", file=rel,
                                      field="<document>")
        except DataFormatError as exc:
            ctx.fail(exc)
            continue
        ctx.files_read.append(rel)
        for i, raw in enumerate(doc):
            ctx.items += 1
            try:
                cases.append(parse(raw, rel, i, ctx))
            except DataFormatError as exc:
                ctx.fail(exc)
    return ctx, cases
