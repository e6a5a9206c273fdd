"""What a ``qgmem serve`` request may be before its model reads it: the limits, the body's bytes and
shape, the JSON, the query strings and the filters.

The bodies of the memory routes are pydantic models (:mod:`qgmem.serving.routes.protocol`); what comes
before them is here, and each check raises :class:`ApiError` (400 naming the field, 413 naming the limit):

- the body is JSON, UTF-8, of at most ``Limits.max_json_containers`` objects and arrays, nested at most
  :data:`MAX_DEPTH` deep, and no string in it (key or value) holds a lone surrogate (``"\\udcff"`` cannot
  be written as UTF-8 by any later stage; the data loaders refuse it the same way);
- the filters of a search or a listing (:func:`check_filters`) and the paging numbers of a query string;
- a ``time`` is an ISO-8601 date or date-time read by the project's time resolver
  (:func:`qgmem.timeexpr.parse_time`); ``"yesterday"`` or ``"2024-13-45"`` is a 400 naming it.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from qgmem.serving.filters import TIME_FIELDS, Filters
from qgmem.timeexpr import parse_time

_DIGITS = re.compile(r"[0-9]{1,12}")
#: deepest JSON nesting a body may have (the deepest valid body is 4 levels: turns[i].text)
MAX_DEPTH = 32


@dataclass
class Limits:
    """What one request may hold (past these: 413)."""

    max_body_bytes: int = 1_000_000
    max_import_bytes: int = 200_000_000  # an import's body: an export of a whole user
    max_turns: int = 500
    max_turn_chars: int = 8_000
    max_speaker_chars: int = 128
    max_question_chars: int = 2_000
    body_timeout_s: float = 30.0  # a body not received within this is a 408 (a stalled client lets go)
    max_json_containers: int = 2_000_000  # objects and arrays one body may hold (see check_shape)
    max_concurrent_imports: int = 2  # imports parsed and stored at once; one more is a 503 with Retry-After


class ApiError(Exception):
    def __init__(self, status: int, message: str, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status, self.message, self.headers = status, message, headers or {}


def bad(message: str) -> ApiError:
    return ApiError(400, message)


# ----------------------------------------------------------------------------------- the JSON body
#: a body longer than this is parsed in a worker thread, one array element at a time (see parse_body)
PARSE_INLINE_BYTES = 64_000
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")  # the only way a lone surrogate gets into valid UTF-8 JSON
_DECODER = json.JSONDecoder()
_SPACE = re.compile(r"[ \t\n\r]*")


def check_shape(raw: bytes, limits: Limits) -> None:
    """A 413 when ``raw`` may hold more objects and arrays than ``limits.max_json_containers``: each costs
    about 70 bytes once parsed whatever its size, so a body of tiny ``{}`` would cost ~25 times its bytes.
    Every ``{`` and ``[`` byte counts (in strings too): a count at memory speed, before any parse."""
    containers = raw.count(b"{") + raw.count(b"[")
    if containers > limits.max_json_containers:
        raise ApiError(413, f"the body holds {containers} '{{' and '[' (objects and arrays, counted in strings "
                            f"too), over the limit of {limits.max_json_containers}")


def parse_body(raw: bytes) -> Any:
    """The JSON of a request body, checked for depth and lone surrogates (see the module docstring).

    A body over :data:`PARSE_INLINE_BYTES` (an import, a batch) is decoded a top-level array element at
    a time, so the worker thread that parses it gives the event loop its turn between elements (a single
    ``json.loads`` holds the interpreter lock until it is done)."""
    try:
        text = raw.decode("utf-8")
        surrogates = _SURROGATE_ESCAPE.search(raw) is not None
        if len(raw) <= PARSE_INLINE_BYTES:
            body = json.loads(text)
            _check_tree(body, "", 0, surrogates)
            return body
        return _decode_pieces(text, surrogates)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        where = f" (line {exc.lineno}, column {exc.colno})" if isinstance(exc, json.JSONDecodeError) else ""
        raise bad(f"malformed JSON body: {getattr(exc, 'msg', 'not UTF-8')}{where}") from None
    except RecursionError:  # nested past the interpreter's recursion limit
        raise bad(f"malformed JSON body: nested more than {MAX_DEPTH} levels deep") from None


def _decode_pieces(text: str, surrogates: bool) -> Any:
    """``json.loads(text)``, decoding each element of a top-level object's arrays on its own."""
    i = _SPACE.match(text, 0).end()
    if not text.startswith("{", i):
        value = json.loads(text)
        _check_tree(value, "", 0, surrogates)
        return value
    body: dict[str, Any] = {}
    i = _SPACE.match(text, i + 1).end()
    closed = text.startswith("}", i)
    while not closed:
        if not text.startswith('"', i):
            raise json.JSONDecodeError("Expecting property name enclosed in double quotes", text, i)
        key, i = json.decoder.scanstring(text, i + 1)
        _check_tree(key, f"{key} (its name)", 0, surrogates)
        i = _expect(text, _SPACE.match(text, i).end(), ":")
        if text.startswith("[", i):
            value, i = [], _SPACE.match(text, i + 1).end()
            while not text.startswith("]", i):
                item, i = _DECODER.raw_decode(text, i)
                _check_tree(item, f"{key}[{len(value)}]", 2, surrogates)
                value.append(item)
                i = _SPACE.match(text, i).end()
                if not text.startswith("]", i):
                    i = _expect(text, i, ",")
            i += 1
        else:
            value, i = _DECODER.raw_decode(text, i)
            _check_tree(value, key, 1, surrogates)
        body[key] = value
        i = _SPACE.match(text, i).end()
        closed = text.startswith("}", i)
        if not closed:
            i = _expect(text, i, ",")
    i = _SPACE.match(text, i + 1).end()
    if i != len(text):
        raise json.JSONDecodeError("Extra data", text, i)
    return body


def _expect(text: str, i: int, mark: str) -> int:
    """The position after ``mark`` (and the space after it) at ``i``; a decode error when it is not there."""
    if not text.startswith(mark, i):
        raise json.JSONDecodeError(f"Expecting '{mark}' delimiter", text, i)
    return _SPACE.match(text, i + 1).end()


def _check_tree(value: Any, where: str, depth: int, surrogates: bool) -> None:
    """Depth and (when the body has a surrogate escape) Unicode of ``value``, without naming paths; on a
    fault the slower walk of :func:`_check_unicode` names where it is."""
    stack = [(value, depth)]
    while stack:
        item, level = stack.pop()
        if level > MAX_DEPTH:
            break
        if isinstance(item, dict):
            if surrogates and not all(_encodes(k) for k in item):
                break
            stack.extend((x, level + 1) for x in item.values())
        elif isinstance(item, list):
            stack.extend((x, level + 1) for x in item)
        elif surrogates and isinstance(item, str) and not _encodes(item):
            break
    else:
        return
    _check_unicode(value, where, depth)


def _encodes(text: str) -> bool:
    try:
        text.encode("utf-8")
        return True
    except UnicodeEncodeError:
        return False


def _check_unicode(body: Any, start: str = "", depth: int = 0) -> None:
    """Every string of ``body`` (keys included) encodes as UTF-8; the first that does not is named."""
    stack: list[tuple[Any, str, int]] = [(body, start, depth)]
    while stack:
        value, where, depth = stack.pop()
        if depth > MAX_DEPTH:
            raise bad(f"malformed JSON body: nested more than {MAX_DEPTH} levels deep (at '{where}')")
        if isinstance(value, str):
            try:
                value.encode("utf-8")
            except UnicodeEncodeError as exc:
                raise bad(f"field '{where or '(body)'}': invalid Unicode: a lone surrogate "
                          f"{value[exc.start]!r} at character {exc.start}") from None
        elif isinstance(value, dict):
            for key, item in value.items():
                name = str(key).encode("utf-8", "backslashreplace").decode("utf-8")  # printable in the message
                path = f"{where}.{name}" if where else name
                stack.append((key, f"{path} (its name)", depth))
                stack.append((item, path, depth + 1))
        elif isinstance(value, list):
            stack.extend((item, f"{where}[{i}]", depth + 1) for i, item in enumerate(value))


# ---------------------------------------------------------------------------------------- fields
def query_params(items: list[tuple[str, str]], allowed: tuple[str, ...]) -> dict[str, str]:
    """A query string's parameters: each one this endpoint takes, at most once (a repeated parameter
    is a 400, never "the last one wins")."""
    out: dict[str, str] = {}
    for name, value in items:
        if name not in allowed:
            raise bad(f"unknown query parameter '{name[:40]}' (this endpoint takes {', '.join(allowed)})")
        if name in out:
            raise bad(f"query parameter '{name}' is given more than once")
        out[name] = value
    return out


def query_integer(query: dict[str, str], name: str, low: int, high: int, default: int) -> int:
    """A paging number: ASCII digits (not ``²``, ``٣`` or full-width ones) within ``low..high``."""
    raw = query.get(name)
    if raw is None:
        return default
    if not _DIGITS.fullmatch(raw) or not low <= int(raw) <= high:
        raise bad(f"query parameter '{name}' must be an integer from {low} to {high} in ASCII digits, "
                  f"got {raw[:20]!r}")
    return int(raw)


# ------------------------------------------------------------------------------------- endpoints
FILTER_FIELDS = ("after", "before", "time_field", "sessions")
#: sessions one batch append may hold (each within ``Limits.max_turns``)
MAX_BATCH_SESSIONS = 100
#: what an export document says it is (``GET /v1/users/{id}/export``, ``POST /v1/users/{id}/import``)
EXPORT_FORMAT, EXPORT_VERSION = "qgmem-user-export", 1
#: what a memory unit id may be (``w0003.u1``); it is never a path
UNIT_ID = re.compile(r"[A-Za-z0-9_.:-]{1,128}")


def check_filters(values: dict[str, Any], where: str = "field") -> Filters:
    """The filters of a search body or a memories query (``where``: ``field`` or ``query parameter``):
    ``after`` / ``before`` ISO-8601 times, ``time_field`` (utterance | fact), ``sessions`` (a list of ids;
    in a query string they are comma-separated)."""
    bounds = {}
    for name in ("after", "before"):
        value = values.get(name)
        if value is not None and (not isinstance(value, str) or parse_time(value) is None):
            raise bad(f"{where} '{name}' must be an ISO-8601 date or date-time (e.g. 2024-05-01 or "
                      f"2024-05-01T10:00:00), got {json.dumps(value)[:64]}")
        bounds[name] = parse_time(value) if value is not None else None
    if bounds["after"] is not None and bounds["before"] is not None and bounds["after"] >= bounds["before"]:
        raise bad(f"{where} 'before' must be later than 'after'")
    time_field = values.get("time_field", TIME_FIELDS[0])
    if time_field not in TIME_FIELDS:
        raise bad(f"{where} 'time_field' must be one of {', '.join(TIME_FIELDS)}, got {json.dumps(time_field)[:20]}")
    sessions = values.get("sessions")
    if sessions is not None:
        if not isinstance(sessions, list) or not sessions or len(sessions) > 10_000 or \
                not all(isinstance(x, str) and 0 < len(x) <= 64 for x in sessions):
            raise bad(f"{where} 'sessions' must be a non-empty list of session ids (as units show them: s0, s1, …)")
        sessions = frozenset(sessions)
    return Filters(bounds["after"], bounds["before"], time_field, sessions)


def check_unit_id(value: Any, what: str = "unit id") -> str:
    if not isinstance(value, str) or not UNIT_ID.fullmatch(value):
        raise bad(f"{what} must match [A-Za-z0-9_.:-]{{1,128}} (a unit id as memories and search show it), "
                  f"got {json.dumps(value)[:40]}")
    return value
