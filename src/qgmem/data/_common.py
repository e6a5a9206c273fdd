"""Plumbing shared by the loaders: reading JSON, checking fields, strict/lenient accounting.

Every check raises :class:`DataFormatError` naming the file, the item index and the field, so a bad
record in a 1 GB dump can be found without a debugger. In lenient mode the same error becomes a
counted skip in the load report instead of an exception.
"""

from __future__ import annotations

import json
import logging
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from qgmem.data.errors import DataFormatError, SkipReport
from qgmem.data.evidence import EvidenceCounts
from qgmem.data.records import Case
from qgmem.errors import InputPathError

logger = logging.getLogger("qgmem.data")

#: default cap on one turn's text, in characters (~5k tokens: far above any real turn of the three data
#: sets, far below the 1 MB pastes that would otherwise become one giant memory unit)
DEFAULT_MAX_TURN_CHARS = 20_000

_TYPE_NAMES = {str: "string", int: "integer", float: "number", list: "list", dict: "object", bool: "boolean"}


@dataclass
class LoadedData:
    """What a loader returns: the cases and a JSON-ready report of how they were read."""

    cases: list[Case]
    report: dict[str, Any] = field(default_factory=dict)


def read_json(path: Path, rel: str) -> Any:
    """Parse one JSON file; malformed JSON names the file, line and column.

    A folder where a file is expected (``data/x.json/``) is an :class:`InputPathError` even in a
    lenient load: it is a mistake in the layout, not a bad record.
    """
    if path.is_dir():
        raise InputPathError(f"{path}: is a folder, but a JSON file is expected here (file {rel})")
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
    if isinstance(value, str) and not value.isascii():
        _check_unicode(value, file=file, item=item, field=name)
    return value


def need_text(obj: Any, key: str, types: type | tuple[type, ...] = str, **kw: Any) -> Any:
    """:func:`need` for a question or an answer: blank text (``""``, spaces) is an error too.

    An empty question cannot be asked and an empty reference scores every answer as wrong; ``None``
    passes through where the field is optional.
    """
    value = need(obj, key, types, **kw)
    if isinstance(value, str) and not value.strip():
        where = kw.get("where", "")
        raise DataFormatError("empty text", file=kw.get("file"), item=kw.get("item"),
                              field=f"{where}.{key}" if where else key)
    return value


def _check_unicode(text: str, *, file: str, item: int | str | None, field: str) -> None:
    """A lone surrogate (``"\\udcff"`` in the JSON) cannot be written as UTF-8 by any later stage."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise DataFormatError(f"invalid Unicode: a lone surrogate {text[exc.start]!r} at character {exc.start}",
                              file=file, item=item, field=field) from None


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    return _TYPE_NAMES.get(type(value), type(value).__name__)


class LoadContext:
    """Strict/lenient policy plus the counters a loader reports (files, items, skips, evidence)."""

    def __init__(self, dataset: str, root: Path, strict: bool, max_turn_chars: int = DEFAULT_MAX_TURN_CHARS):
        if not isinstance(max_turn_chars, int) or isinstance(max_turn_chars, bool) or max_turn_chars < 1:
            raise ValueError(f"max_turn_chars must be an integer >= 1, got {max_turn_chars!r}")
        self.dataset = dataset
        self.root = root
        self.strict = strict
        self.max_turn_chars = max_turn_chars
        self.files_read: list[str] = []
        self.items = 0
        self.skips = SkipReport()
        self.evidence = EvidenceCounts()
        self.truncated_turns = 0
        self.truncated_examples: list[str] = []
        self._ids: dict[str, str] = {}

    def cap_turn(self, text: str, *, file: str, item: int | str | None, field: str) -> str:
        """``text`` cut to ``max_turn_chars`` (at a space when one is near), counted and logged."""
        if len(text) <= self.max_turn_chars:
            return text
        cut = text[: self.max_turn_chars]
        space = cut.rfind(" ", self.max_turn_chars - 200)
        if space > 0:
            cut = cut[:space]
        self.truncated_turns += 1
        where = f"file {file}, item {item}, field {field}"
        if len(self.truncated_examples) < 10:
            self.truncated_examples.append(f"{where}: {len(text)} chars cut to {len(cut)}")
        logger.warning("%s: turn of %d chars cut to %d (max_turn_chars %d)", where, len(text), len(cut),
                       self.max_turn_chars)
        return cut

    def claim_id(self, kind: str, value: str, *, file: str, item: int | str | None, field: str) -> None:
        """Record that ``value`` (a dialogue or question id) is used at this place; a second use is an error.

        The error names both places, so the two records can be compared and one of them fixed.
        """
        key = f"{kind}\0{value}"
        here = f"file {file}, item {item}"
        if key in self._ids:
            raise DataFormatError(f"duplicate {kind} {value!r}: already used at {self._ids[key]}", file=file,
                                  item=item, field=field)
        self._ids[key] = here

    @contextmanager
    def record(self) -> Iterator[None]:
        """Count what one record adds (evidence mappings, cut turns) only when it is kept.

        A record that fails (strict: raised; lenient: skipped) counts nowhere but in the skip report, so
        a skipped duplicate never adds its evidence a second time.
        """
        evidence, truncated, examples = self.evidence, self.truncated_turns, len(self.truncated_examples)
        self.evidence = EvidenceCounts()
        try:
            yield
        except BaseException:
            self.truncated_turns = truncated
            del self.truncated_examples[examples:]
            raise
        else:
            evidence.merge(self.evidence)
        finally:
            self.evidence = evidence

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
            "max_turn_chars": self.max_turn_chars,
            "truncated_turns": self.truncated_turns,
            "truncated_examples": list(self.truncated_examples),
            "categories": dict(sorted(categories.items())),
        }


def load_json_lists(dataset: str, path: str | Path, strict: bool, what: str, parse, id_kind: str,
                    max_turn_chars: int = DEFAULT_MAX_TURN_CHARS) -> tuple[LoadContext, list[Case]]:
    """Read a JSON file (or every ``*.json`` in a folder) whose top level is a list of ``what``.

    ``parse(raw, rel, index, ctx)`` turns one element into a ``Case``; a ``DataFormatError`` from it
    (or from reading a file) stops a strict load and is counted as a skip in a lenient one. Case ids
    (``id_kind``: ``sample_id``, ``question_id``) must be unique over all files: a repeat is such an
    error naming both places (lenient: the later one is skipped).
    """
    root = Path(path)
    if not root.exists():
        raise InputPathError(f"no such file or folder: {root}")
    files = sorted(root.glob("*.json")) if root.is_dir() else [root]
    if not files:
        raise InputPathError(f"no *.json files in {root}")
    ctx = LoadContext(dataset, root if root.is_dir() else root.parent, strict, max_turn_chars)
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
                with ctx.record():
                    case = parse(raw, rel, i, ctx)
                    ctx.claim_id(id_kind, case.id, file=rel, item=i, field=id_kind)
            except DataFormatError as exc:
                ctx.fail(exc)
            else:
                cases.append(case)
    return ctx, cases
