"""docs/data_module.md's settings table states ``QGMemDataModule``'s signature and the preset values it names."""

from __future__ import annotations

import ast
import inspect
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from qgmem.training.datamodule import QGMemDataModule

REPO = Path(__file__).resolve().parents[2]
DOC = REPO / "docs" / "data_module.md"
PRESET_NOTE = re.compile(r"^\(the `(?P<preset>[a-z0-9_]+)` preset: (?P<values>.*)\)$")


def split_note(cell: str) -> tuple[str, str]:
    """``"`1` (the `default` preset: `2`)"`` -> the values and the note after them (a parenthesis outside backticks)."""
    quoted = False
    for i, char in enumerate(cell):
        quoted ^= char == "`"
        if char == "(" and not quoted:
            return cell[:i].strip(), cell[i:].strip()
    return cell.strip(), ""


def value(text: str) -> Any:
    """A table value as Python: a literal (``(0.7, 0.15, 0.15)``, ``2``) or YAML (``null``, ``true``, words)."""
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return yaml.safe_load(text)


def table(text: str) -> dict[str, tuple[Any, dict[str, Any]]]:
    """``argument -> (default, {preset: value})`` as the table under *Settings* writes them."""
    section = text.split("## Settings", 1)[1].split("\n## ", 1)[0]
    rows: dict[str, tuple[Any, dict[str, Any]]] = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split(" | ")]
        if len(cells) < 3 or not cells[0].startswith("`"):
            continue
        names = re.findall(r"`([a-z_0-9]+)`", cells[0])
        head, note = split_note(cells[1])
        defaults = [value(v) for v in re.findall(r"`([^`]*)`", head)]
        assert len(defaults) == len(names), f"{line}: {len(names)} names, {len(defaults)} values"
        presets: list[dict[str, Any]] = [{} for _ in names]
        match = PRESET_NOTE.match(note)
        if match:
            preset_values = [value(v) for v in re.findall(r"`([^`]*)`", match["values"])]
            assert len(preset_values) == len(names), line
            for slot, v in zip(presets, preset_values):
                slot[match["preset"]] = v
        rows.update({n: (d, p) for n, d, p in zip(names, defaults, presets)})
    return rows


def same(written: Any, actual: Any) -> bool:
    if isinstance(actual, tuple):
        actual = list(actual)
    if isinstance(written, tuple):
        written = list(written)
    if isinstance(actual, Path):
        actual = str(actual)
    if isinstance(written, bool) or isinstance(actual, bool):  # false is not 0
        return type(written) is type(actual) and written == actual
    return written == actual


SIGNATURE = {name: p.default for name, p in inspect.signature(QGMemDataModule.__init__).parameters.items()
             if name != "self"}
DOCUMENTED = table(DOC.read_text(encoding="utf-8"))


def preset_data(name: str) -> dict[str, Any]:
    return yaml.safe_load((REPO / "configs" / f"{name}.yaml").read_text(encoding="utf-8")).get("data") or {}


def test_the_table_has_one_row_per_argument():
    assert set(DOCUMENTED) == set(SIGNATURE)


@pytest.mark.parametrize("name", sorted(SIGNATURE))
def test_each_documented_default_is_the_signature_default(name):
    assert same(DOCUMENTED[name][0], SIGNATURE[name]), (name, DOCUMENTED[name][0], SIGNATURE[name])


def test_each_preset_value_the_table_names_is_the_presets():
    named = [(name, preset, v) for name, (_, presets) in DOCUMENTED.items() for preset, v in presets.items()]
    assert named  # the table names some preset values (the `default` preset's budget)
    for name, preset, written in named:
        assert same(written, preset_data(preset).get(name)), (name, preset, written)


def test_the_table_names_every_value_the_default_preset_changes():
    changed = {name for name in preset_data("default") if name in SIGNATURE}
    assert changed and changed <= {name for name, (_, presets) in DOCUMENTED.items() if "default" in presets}


def test_the_reading_tells_a_stale_row():  # controls for the check itself
    stale = table("## Settings\n| `max_prompt_tokens`, `answer_filter` | `320`, `match` | x |\n"
                  "| `cache_processes` | `1` (the `default` preset: `3`) | y |\n## Next\n")
    assert not same(stale["max_prompt_tokens"][0], SIGNATURE["max_prompt_tokens"])
    assert not same(stale["answer_filter"][0], SIGNATURE["answer_filter"])
    assert same(stale["cache_processes"][0], SIGNATURE["cache_processes"])
    assert not same(stale["cache_processes"][1]["default"], preset_data("default")["cache_processes"])
    assert same(value("(0.7, 0.15, 0.15)"), (0.7, 0.15, 0.15)) and same(value("null"), None)
    assert not same(value("0"), False) and not same(value("false"), 0)
