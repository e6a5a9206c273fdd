"""A settings dataclass as command-line flags: one typed flag per field, documented by the field's ``#:`` comment.

Every command outside LightningCLI (``serve``, ``data-stats``, ``migrate-store`` ...) describes its
settings once, as a dataclass whose fields carry their type, default and a ``#:`` comment (on the
field's line, or on the lines just above it)::

    port: int = 8000  #: TCP port

Each field becomes ``--port`` (underscores as dashes), parsed by jsonargparse with the field's type, so
``--config FILE`` takes the same settings as YAML keys named like the fields and ``--print_config``
prints them. A field without a default is a required flag; a ``bool`` field defaulting to ``False`` is a
switch; a ``Literal`` field is a choice among its values (argparse's one-line "invalid choice" names the
flag). A field whose type is itself a settings dataclass contributes that dataclass's flags, named as
its fields are (no prefix): a block of flags several commands share (the ``--lm-*`` flags of a serving
engine) is declared once and nested where it is used; ``--config`` keys stay flat. A field's
``metadata`` may name another flag (``{"flag": "path"}``), a switch that turns a ``bool`` field off
beside the one that turns it on (``{"off_flag": "lenient", "off_help": ...}``: ``--strict`` or
``--lenient``, never both), another type to parse the text with
(``{"type": parse_count}``), an ``action`` (``"append"`` for a repeatable flag), a ``metavar`` or an
``nargs`` (``3`` with ``"type": float``: a flag of three numbers, each checked as argparse checks one).
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import inspect
import textwrap
from functools import cache
from types import UnionType
from typing import Any, Literal, TypeVar, Union, get_args, get_origin, get_type_hints

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


def nested_settings(hint: Any) -> type | None:
    """The settings dataclass a field nests (its type hint is one), else ``None``."""
    return hint if isinstance(hint, type) and dataclasses.is_dataclass(hint) else None


def literal_choices(hint: Any) -> tuple | None:
    """The values of a ``Literal[...]`` hint (``Literal[...] | None`` too), else ``None``."""
    args = [a for a in get_args(hint) if a is not type(None)] if get_origin(hint) in (Union, UnionType) else [hint]
    return get_args(args[0]) if len(args) == 1 and get_origin(args[0]) is Literal else None


def add_settings_arguments(parser: argparse.ArgumentParser, cls: type, *, skip: tuple[str, ...] = ()) -> None:
    """One flag per field of the dataclass ``cls`` (but ``skip``) on a jsonargparse ``parser``; the fields of
    a nested settings dataclass are flags too."""
    docs, hints = field_docs(cls), get_type_hints(cls)
    for f in dataclasses.fields(cls):
        if f.name in skip:
            continue
        if nested := nested_settings(hints[f.name]):
            add_settings_arguments(parser, nested, skip=skip)
            continue
        kwargs: dict[str, Any] = {"dest": f.name, "help": docs.get(f.name, "")}
        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            kwargs["required"] = True
        elif hints[f.name] is bool and f.default is False:
            parser.add_argument(flag_name(f), action="store_true", **kwargs)
            continue
        elif hints[f.name] is bool and "off_flag" in f.metadata:  # two switches, one setting: --strict / --lenient
            pair = parser.add_mutually_exclusive_group()
            pair.add_argument(flag_name(f), action="store_true", default=f.default, **kwargs)
            pair.add_argument("--" + f.metadata["off_flag"].replace("_", "-"), dest=f.name, action="store_false",
                              help=f.metadata.get("off_help", ""))
            continue
        else:
            kwargs["default"] = f.default if f.default is not dataclasses.MISSING else f.default_factory()
        kwargs.update({k: f.metadata[k] for k in ("action", "metavar", "nargs") if k in f.metadata})
        choices = literal_choices(hints[f.name])
        if choices is not None:  # argparse checks a choice itself, the text taken as it is
            kwargs["choices"] = choices
        elif kwargs.get("action") != "append":  # a repeated flag's values stay text (a --config list: a list)
            kwargs["type"] = hints[f.name]
        if "type" in f.metadata:
            kwargs["type"] = f.metadata["type"]
        parser.add_argument(flag_name(f), **kwargs)


class RetiredFlag(argparse.ArgumentTypeError, ValueError):
    """A retired flag or ``--config`` key (argparse reports the one, jsonargparse the other)."""


def add_retired_arguments(parser: argparse.ArgumentParser, retired: dict[str, str], *, dashes: bool = True) -> None:
    """Hidden flags for retired settings (``field -> what happens instead``): given as a flag or as a
    ``--config`` key, each is refused with that message instead of "unrecognized". ``dashes=False``: the
    flag keeps the field's underscores, as LightningCLI's flags do."""
    for name, instead in retired.items():
        flag = "--" + (name.replace("_", "-") if dashes else name)

        def refuse(value: str, flag: str = flag, instead: str = instead) -> None:
            raise RetiredFlag(f"{flag} was retired: {instead}")

        parser.add_argument(flag, dest=name, type=refuse, help=argparse.SUPPRESS, default=argparse.SUPPRESS)


def settings_from_args(cls: type[T], args: argparse.Namespace, *, skip: tuple[str, ...] = ()) -> T:
    """The ``cls`` the parsed flags describe (fields in ``skip`` keep their defaults; a nested settings
    dataclass is built from its own flags)."""
    hints = get_type_hints(cls)
    values = {}
    for f in dataclasses.fields(cls):
        if f.name in skip:
            continue
        nested = nested_settings(hints[f.name])
        values[f.name] = settings_from_args(nested, args, skip=skip) if nested else getattr(args, f.name)
    return cls(**values)
