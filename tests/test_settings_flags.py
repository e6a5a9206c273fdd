"""A settings dataclass as flags: each field's type, default and ``#:`` comment make one flag."""

from __future__ import annotations

from dataclasses import dataclass, field, fields
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
    parser = command_parser("example", "", lambda p: add_settings_arguments(p, Example, skip=("fixed",)))
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


@dataclass
class Inner:
    url: str | None = None  #: where it is served


@dataclass(kw_only=True)
class Outer:
    inner: Inner = field(default_factory=Inner)
    names: list[str] = field(metadata={"action": "append"})  #: repeat for more


def test_a_nested_settings_dataclass_gives_its_own_flags_and_flat_config_keys(tmp_path):
    parser = command_parser("outer", "", lambda p: add_settings_arguments(p, Outer))
    args = parser.parse_args(["--url", "http://x", "--names", "a", "--names", "b"])
    assert settings_from_args(Outer, args) == Outer(inner=Inner(url="http://x"), names=["a", "b"])
    config = tmp_path / "c.yaml"
    config.write_text("url: http://y\nnames: [c]\n")
    assert settings_from_args(Outer, parser.parse_args(["--config", str(config)])) == Outer(inner=Inner(url="http://y"),
                                                                                            names=["c"])
    assert "where it is served" in " ".join(parser.format_help().split())


def test_a_bad_choice_is_argparse_s_one_line(capsys):
    with pytest.raises(SystemExit):
        _parse(["--path", "p", "--mode", "c"])
    errors = [line for line in capsys.readouterr().err.splitlines() if "error:" in line]
    assert errors == ["error: argument --mode: invalid choice: 'c' (choose from 'a', 'b')"]


#: the commands whose LM may run in a serving engine, and the flags each parser requires
ENGINE_COMMANDS = {"serve": [], "mcp": [], "answer": ["--question", "q"],
                   "eval-qa": ["--dataset", "locomo", "--path", "p"]}


def test_each_engine_flag_is_declared_once():
    """``--lm-url``, ``--lm-model`` and ``--lm-api-key-env`` are the fields of ``EngineSettings`` and nowhere
    else: no other settings field of that name and no hand-made flag. Every command serving an export
    shows the help and default of ``LoadSettings``' fields (``--export``, ``--device``, ``--max-new-tokens``
    and the engine's) and builds that one block from them."""
    import ast
    import importlib
    from pathlib import Path

    import qgmem
    from qgmem.cli import COMMANDS
    from qgmem.serving.export_models import EngineSettings, LoadSettings

    names = [f.name for f in fields(EngineSettings)]
    flags = ["--" + n.replace("_", "-") for n in names]
    assert flags == ["--lm-url", "--lm-model", "--lm-api-key-env"]
    declared, by_hand = [], []
    for path in Path(qgmem.__file__).parent.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ClassDef):
                declared += [(node.name, s.target.id) for s in node.body
                             if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name) and s.target.id in names]
            if isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "add_argument":
                by_hand += [path.name for a in node.args if isinstance(a, ast.Constant) and a.value in flags]
    assert declared == [("EngineSettings", n) for n in names] and by_hand == []
    docs = {**field_docs(LoadSettings), **field_docs(EngineSettings)}
    shared = {"--" + n.replace("_", "-"): n for n in docs}
    assert set(shared) == {"--export", "--device", "--max-new-tokens", *flags}
    given = ["--export", "e", "--device", "cpu", "--max-new-tokens", "7", "--lm-url", "http://127.0.0.1:8100/v1",
             "--lm-model", "m"]
    expected = LoadSettings("e", "cpu", 7, EngineSettings(lm_url="http://127.0.0.1:8100/v1", lm_model="m"))
    for command, required in ENGINE_COMMANDS.items():
        module = importlib.import_module(COMMANDS[command][0])
        parser = command_parser(command, "", module.add_arguments)
        actions = {a.option_strings[0]: a for a in parser._actions if a.option_strings}
        for flag, name in shared.items():
            assert actions[flag].help == docs[name] and actions[flag].default is None, (command, flag)
        assert settings_from_args(LoadSettings, parser.parse_args([*required, *given])) == expected, command


#: the modules that may build a parser or add a flag by hand, and why
PARSER_MODULES = {
    "settings_flags.py": "a settings dataclass as flags, the one way a command's flags are made",
    "errors.py": "command_parser: the command's parser, --debug and --config",
    "cli.py": "the table of subcommands: only the command's name is parsed there",
    "training/cli.py": "LightningCLI's parser and its own flags (fit, validate, test)",
    "training/build_cache.py": "build-cache's flags on LightningCLI's parser, and the data section's parser",
}
_BY_HAND = {"ArgumentParser", "add_argument", "add_argument_group", "add_mutually_exclusive_group", "add_subparsers"}


def _hand_made_parsers(source: str) -> list[int]:
    """The lines of ``source`` that build a parser or add a flag themselves."""
    import ast

    return [node.lineno for node in ast.walk(ast.parse(source)) if isinstance(node, ast.Call)
            and (getattr(node.func, "attr", None) or getattr(node.func, "id", None)) in _BY_HAND]


def test_only_settings_flags_errors_and_lightning_build_parsers():
    """A command's flags are a settings dataclass: a module that builds a parser by hand fails here."""
    from pathlib import Path

    import qgmem

    assert _hand_made_parsers("import argparse\np = argparse.ArgumentParser()\np.add_argument('--x')\n") == [2, 3]
    assert _hand_made_parsers("add_settings_arguments(parser, Example)\n") == []
    root = Path(qgmem.__file__).parent
    found = {path.relative_to(root).as_posix(): lines for path in sorted(root.rglob("*.py"))
             if (lines := _hand_made_parsers(path.read_text(encoding="utf-8")))}
    assert set(found) == set(PARSER_MODULES), {k: v for k, v in found.items() if k not in PARSER_MODULES}


@dataclass
class Paired:
    #: stop at the first bad record
    strict: bool = field(default=True, metadata={"off_flag": "lenient", "off_help": "skip bad records"})
    shares: list[float] = field(default_factory=lambda: [0.5, 0.5], metadata={"nargs": 2, "type": float})  #: two


def test_off_flag_and_nargs():
    """A ``bool`` field with an ``off_flag`` is two switches that exclude each other; ``nargs`` takes that many."""
    parser = command_parser("p", "", lambda p: add_settings_arguments(p, Paired))
    assert settings_from_args(Paired, parser.parse_args([])) == Paired()
    assert settings_from_args(Paired, parser.parse_args(["--strict"])) == Paired()
    assert settings_from_args(Paired, parser.parse_args(["--lenient", "--shares", "0.2", "0.8"])) == Paired(
        strict=False, shares=[0.2, 0.8])
    helps = {a.option_strings[0]: a.help for a in parser._actions if a.option_strings}
    assert helps["--strict"] == "stop at the first bad record" and helps["--lenient"] == "skip bad records"
    for bad in (["--strict", "--lenient"], ["--shares", "0.1"]):
        with pytest.raises(SystemExit) as exc:
            parser.parse_args(bad)
        assert exc.value.code == 2
