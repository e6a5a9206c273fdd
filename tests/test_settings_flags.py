"""A settings dataclass as flags: each field's type, default and ``#:`` comment make one flag."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import pytest

from qgmem.errors import command_parser
from qgmem.settings_flags import add_settings_arguments, field_docs, settings_from_args


def _twice(text: str) -> int:
    return 2 * int(text)


@dataclass
class Example:
    path: str  #: where it reads
    #: how many, said on the line above
    #: over two lines
    count: int = 3
    mode: Literal["a", "b"] = "a"  #: one of two
    name: str | None = None
    verbose: bool = False  #: say more
    doubled: int = field(default=1, metadata={"type": _twice, "flag": "twice"})  #: parsed by its own type
    fixed: float = 0.5  #: no flag


def _parse(argv: list[str]):
    parser = command_parser("example", "", lambda p: add_settings_arguments(p, Example, skip=("fixed",)), True)
    return parser, parser.parse_args(argv)


def test_field_docs_reads_trailing_and_leading_comments():
    assert field_docs(Example) == {"path": "where it reads", "count": "how many, said on the line above over two lines",
                                   "mode": "one of two", "verbose": "say more", "doubled": "parsed by its own type",
                                   "fixed": "no flag"}


def test_flags_follow_the_fields():
    parser, args = _parse(["--path", "p", "--count", "4", "--mode", "b", "--verbose", "--twice", "5"])
    assert settings_from_args(Example, args, skip=("fixed",)) == Example(path="p", count=4, mode="b", verbose=True,
                                                                         doubled=10)
    assert settings_from_args(Example, _parse(["--path", "p"])[1], skip=("fixed",)) == Example(path="p")
    flags = {s for a in parser._actions for s in a.option_strings}
    assert {"--path", "--count", "--mode", "--name", "--verbose", "--twice"} <= flags and "--fixed" not in flags
    assert "how many, said on the line above over two lines" in " ".join(parser.format_help().split())


@pytest.mark.parametrize("argv", [[], ["--path", "p", "--mode", "c"], ["--path", "p", "--count", "x"]])
def test_a_missing_or_bad_value_is_refused(argv):
    with pytest.raises(SystemExit) as exc:
        _parse(argv)
    assert exc.value.code == 2
