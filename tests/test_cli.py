"""The command-line convention: a user's error is one message and exit 2; ``--debug`` shows the traceback."""

from __future__ import annotations

import importlib
import json
from pathlib import Path

import pytest

from qgmem.cli import COMMANDS, main
from qgmem.errors import USER_ERROR_EXIT, UserError, as_user_error, command_parser

FIXTURES = Path(__file__).parent / "fixtures"

#: every command that reads a data set, and the extra flags its parser requires
DATA_COMMANDS = {"data-stats": [], "build-memory": ["--out", "o"], "eval-retrieval": [], "eval-qa": ["--export", "e"]}


@pytest.fixture()
def locomo_file() -> Path:
    return FIXTURES / "locomo_small.json"


def _parser(command: str):
    """The parser ``qgmem COMMAND`` parses with."""
    module = importlib.import_module(COMMANDS[command][0])
    return command_parser(f"qgmem {command}", "", module.add_arguments)


def _errors(capsys) -> list[str]:
    return [line for line in capsys.readouterr().err.splitlines() if line.strip()]


@pytest.mark.parametrize("command", sorted(DATA_COMMANDS))
def test_missing_path_is_one_message_and_exit_2(command, tmp_path, capsys):
    missing = tmp_path / "no_such.json"
    code = main([command, "--dataset", "locomo", "--path", str(missing), *DATA_COMMANDS[command]])
    err = _errors(capsys)
    assert code == USER_ERROR_EXIT
    assert err[0].startswith(f"qgmem {command}: error: ") and str(missing) in err[0]
    assert not any("Traceback" in line for line in err) and len(err) == 2  # message + the --debug hint


@pytest.mark.parametrize("position", ["before", "after"])
def test_debug_shows_the_traceback(position, tmp_path, capsys):
    args = ["data-stats", "--dataset", "locomo", "--path", str(tmp_path / "missing.json")]
    code = main(["--debug", *args] if position == "before" else [*args, "--debug"])
    err = capsys.readouterr().err
    assert code == USER_ERROR_EXIT and "Traceback (most recent call last)" in err
    assert err.strip().splitlines()[-1].startswith("qgmem data-stats: error: ")


def test_malformed_file_names_file_and_position(tmp_path, capsys):
    bad = tmp_path / "locomo.json"
    bad.write_text('[{"sample_id": "a", "conversation": {', encoding="utf-8")
    assert main(["data-stats", "--dataset", "locomo", "--path", str(bad)]) == USER_ERROR_EXIT
    err = _errors(capsys)
    assert "file locomo.json" in err[0] and "malformed JSON" in err[0] and "line 1" in err[0]


def test_bad_record_names_item_and_field(tmp_path, locomo_file, capsys):
    doc = json.loads(locomo_file.read_text(encoding="utf-8"))
    doc[1]["qa"][0]["category"] = "two"
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(doc), encoding="utf-8")
    assert main(["data-stats", "--dataset", "locomo", "--path", str(bad)]) == USER_ERROR_EXIT
    assert "item 1, field qa[0].category: expected integer, got string" in _errors(capsys)[0]


@pytest.mark.parametrize(("flags", "needle"), [
    (["--split-ratios", "a", "b", "c"], "invalid float value"),
    (["--group-key", "planet"], "invalid choice"),
    (["--no-such-flag"], "unrecognized arguments"),
])
def test_bad_flag_value_exits_2(flags, needle, locomo_file, capsys):
    code = main(["data-stats", "--dataset", "locomo", "--path", str(locomo_file), *flags])
    err = capsys.readouterr().err  # argparse's own convention: the usage, then one line naming the flag
    assert code == USER_ERROR_EXIT and needle in err and "Traceback" not in err


def test_flag_value_rejected_by_settings_is_a_user_error(tmp_path, locomo_file, capsys):
    code = main(["build-memory", "--dataset", "locomo", "--path", str(locomo_file), "--out", str(tmp_path),
                 "--window-size", "4", "--window-overlap", "4"])
    err = _errors(capsys)
    assert code == USER_ERROR_EXIT and "bad option: window_overlap must be in [0, window_size)" in err[0]


def test_option_for_the_wrong_dataset_is_a_user_error(locomo_file, capsys):
    code = main(["data-stats", "--dataset", "locomo", "--path", str(locomo_file), "--distractor-conversations", "2"])
    assert code == USER_ERROR_EXIT and "applies to --dataset convomem only" in _errors(capsys)[0]


def test_unknown_command_exits_2(capsys):
    assert main(["train-everything"]) == USER_ERROR_EXIT and "invalid choice" in capsys.readouterr().err


def test_version(capsys):
    from qgmem import __version__

    assert main(["--version"]) == 0 and capsys.readouterr().out == f"qgmem {__version__}\n"


def test_help_exits_0(capsys):
    assert main(["data-stats", "--help"]) == 0 and "--lenient" in capsys.readouterr().out


@pytest.mark.parametrize("command", sorted(DATA_COMMANDS))
@pytest.mark.parametrize("mode", ["--lenient", "--strict"])
def test_every_data_command_takes_strict_and_lenient(command, mode):
    parser = _parser(command)
    args = parser.parse_args(["--dataset", "locomo", "--path", "p", *DATA_COMMANDS[command], mode])
    assert args.strict is (mode == "--strict")
    assert parser.parse_args(["--dataset", "locomo", "--path", "p", *DATA_COMMANDS[command]]).strict is True


def test_data_commands_list_is_complete():
    """A new command with a --dataset flag must be added to DATA_COMMANDS (and so take --lenient)."""
    reading = set()
    for name, (module, _) in COMMANDS.items():
        if not hasattr(importlib.import_module(module), "add_arguments"):
            continue  # a command with its own jsonargparse parser (build-cache): its data flags are the data module's
        parser = _parser(name)
        if any("--dataset" in a.option_strings for a in parser._actions):
            reading.add(name)
    assert reading == set(DATA_COMMANDS)


def test_bug_keeps_its_traceback(monkeypatch):
    import qgmem.data.stats

    def broken(args):
        raise KeyError("a bug, not the user's input")

    monkeypatch.setattr(qgmem.data.stats, "run", broken)
    with pytest.raises(KeyError):
        main(["data-stats", "--dataset", "locomo", "--path", "x"])


def test_as_user_error_converts_only_the_named_types():
    with pytest.raises(UserError, match="^bad: nope$"):
        with as_user_error(ValueError, prefix="bad: "):
            raise ValueError("nope")
    with pytest.raises(TypeError):
        with as_user_error(ValueError):
            raise TypeError("not converted")


def test_user_error_hint_is_part_of_the_message():
    assert str(UserError("store is corrupt", hint="rebuild with qgmem build-memory")) == \
        "store is corrupt (rebuild with qgmem build-memory)"


@pytest.mark.parametrize("command,flag,value", [("eval-qa", "limit", 3), ("answer", "max_new_tokens", 7),
                                                ("eval-retrieval", "k", 4), ("serve", "max_batch", 3),
                                                ("build-memory", "window_size", 5), ("train-reranker", "negatives", 3)])
def test_commands_that_read_settings_take_config_and_print_config(command, flag, value, tmp_path, capsys):
    """``--print_config`` shows the resolved flags as YAML, and that YAML is a ``--config`` file."""
    import yaml

    assert main([command, "--print_config"]) == 0
    printed = yaml.safe_load(capsys.readouterr().out)
    assert flag in printed and printed[flag] != value
    config = tmp_path / "c.yaml"
    config.write_text(yaml.safe_dump({**printed, flag: value}))
    assert main([command, "--config", str(config), "--print_config"]) == 0
    again = yaml.safe_load(capsys.readouterr().out)
    assert again == {**printed, flag: value}
    assert main([command, "--config", str(config), f"--{flag.replace('_', '-')}", "9", "--print_config"]) == 0
    assert yaml.safe_load(capsys.readouterr().out)[flag] == 9  # a flag after --config wins


@pytest.mark.parametrize(("flag", "value", "needle"), [
    ("--channels", "turns", "channels must be a non-empty subset"),
    ("--dense-speaker-names", "blend", "invalid choice: 'blend'"),  # retired: only keep | drop
])
def test_bad_activation_options_are_a_user_error(flag, value, needle, locomo_file, capsys):
    code = main(["eval-retrieval", "--dataset", "locomo", "--path", str(locomo_file), flag, value])
    err = _errors(capsys)
    assert code == USER_ERROR_EXIT and any(needle in line for line in err)


#: what a command may load only once its flags are parsed (each takes seconds to import)
HEAVY_MODULES = ("torch", "transformers", "lightning", "sentence_transformers", "torch_geometric", "spacy", "faiss")


#: commands whose parser LightningCLI builds from the training classes (as ``fit|validate|test``)
LIGHTNING_PARSED = {"build-cache"}


@pytest.mark.parametrize("command", sorted(set(COMMANDS) - LIGHTNING_PARSED))
def test_help_and_a_bad_flag_load_no_heavy_module(command):
    """``qgmem COMMAND --help`` and a misspelt flag answer before torch and friends are imported, so they answer
    fast."""
    import subprocess
    import sys

    code = ("import sys; from qgmem.cli import main; "
            f"codes = [main([{command!r}, '--help']), main([{command!r}, '--no-such-flag'])]; "
            f"print(codes, sorted(m for m in {HEAVY_MODULES!r} if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "[0, 2] []"
