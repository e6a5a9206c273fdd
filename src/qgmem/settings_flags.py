"""A settings dataclass as command-line flags: one typed flag per field, documented by the field's ``#:`` comment.

The commands that read settings (``serve``, ``eval-retrieval``, ``build-memory``, ``train-reranker``)
describe them once, as a dataclass whose fields carry their type, default and a ``#:`` comment (on the
field's line, or on the lines just above it)::

    port: int = 8000  #: TCP port

Each field becomes ``--port`` (underscores as dashes), parsed by jsonargparse with the field's type, so
``--config FILE`` takes the same settings as YAML keys named like the fields and ``--print_config``
prints them. A field without a default is a required flag; a ``bool`` field defaulting to ``False`` is a
switch. A field's ``metadata`` may name another flag (``{"flag": "path"}``) or another type to parse
the text with (``{"type": parse_count}``).
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import inspect
import textwrap
from functools import cache
from typing import Any, TypeVar, get_type_hints

T = TypeVar("T")


@cache
def field_docs(cls: type) -> dict[str, str]:
    """``field -> its #: comment`` for a dataclass (comment lines above a field are joined with spaces)."""
    lines = textwrap.dedent(inspect.getsource(cls)).splitlines()
    docs = {}
    for node in ast.parse("\n".join(lines)).body[0].body:
        if not isinstance(node, ast.AnnAssign) or not isinstance(node.target, ast.Name):
            continue
        _, sep, trailing = lines[node.end_lineno - 1][node.end_col_offset:].partition("#:")
        if sep:
            docs[node.target.id] = trailing.strip()
            continue
        above, i = [], node.lineno - 2
        while i >= 0 and lines[i].strip().startswith("#:"):
            above.insert(0, lines[i].strip()[2:].strip())
            i -= 1
        if above:
            docs[node.target.id] = " ".join(above)
    return docs


def flag_name(f: dataclasses.Field) -> str:
    """The flag of a settings field: ``--max-batch`` for ``max_batch`` (or the ``flag`` its metadata names)."""
    return "--" + f.metadata.get("flag", f.name).replace("_", "-")


def add_settings_arguments(parser: argparse.ArgumentParser, cls: type, *, skip: tuple[str, ...] = ()) -> None:
    """One flag per field of the dataclass ``cls`` (but ``skip``) on a jsonargparse ``parser``."""
    docs, hints = field_docs(cls), get_type_hints(cls)
    for f in dataclasses.fields(cls):
        if f.name in skip:
            continue
        kwargs: dict[str, Any] = {"dest": f.name, "help": docs.get(f.name, "")}
        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            kwargs["required"] = True
        elif hints[f.name] is bool and f.default is False:
            parser.add_argument(flag_name(f), action="store_true", **kwargs)
            continue
        else:
            kwargs["default"] = f.default if f.default is not dataclasses.MISSING else f.default_factory()
        parser.add_argument(flag_name(f), type=f.metadata.get("type", hints[f.name]), **kwargs)


class RetiredFlag(argparse.ArgumentTypeError, ValueError):
    """A retired flag or ``--config`` key (argparse reports the one, jsonargparse the other)."""


def add_retired_arguments(parser: argparse.ArgumentParser, retired: dict[str, str]) -> None:
    """Hidden flags for retired settings (``field -> what happens instead``): given as a flag or as a
    ``--config`` key, each is refused with that message instead of "unrecognized"."""
    for name, instead in retired.items():
        flag = "--" + name.replace("_", "-")

        def refuse(value: str, flag: str = flag, instead: str = instead) -> None:
            raise RetiredFlag(f"{flag} was retired: {instead}")

        parser.add_argument(flag, dest=name, type=refuse, help=argparse.SUPPRESS, default=argparse.SUPPRESS)


def settings_from_args(cls: type[T], args: argparse.Namespace, *, skip: tuple[str, ...] = ()) -> T:
    """The ``cls`` the parsed flags describe (fields in ``skip`` keep their defaults)."""
    return cls(**{f.name: getattr(args, f.name) for f in dataclasses.fields(cls) if f.name not in skip})
