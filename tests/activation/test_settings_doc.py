"""The settings table of docs/activation.md states ``ActivationConfig``'s defaults, not older ones."""

from __future__ import annotations

import re
from dataclasses import fields
from pathlib import Path

import pytest

from qgmem.activation.config import ActivationConfig

DOC = Path(__file__).resolve().parents[2] / "docs" / "activation.md"


def documented_defaults() -> dict[str, str]:
    """``field -> default`` as the table under *Settings (`ActivationConfig`)* writes it."""
    text = DOC.read_text(encoding="utf-8")
    section = text.split("## Settings (`ActivationConfig`)", 1)[1].split("\n## ", 1)[0]
    out = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) < 3 or not cells[0].startswith("`"):
            continue
        names = re.findall(r"`([a-z_0-9]+)`", cells[0])
        if len(names) == 1:
            out[names[0]] = cells[1]
        else:  # "`pool_size`, `channel_depth` | 100, 100"
            values = [v.strip() for v in cells[1].split(",")]
            assert len(values) == len(names), line
            out.update(zip(names, values))
    return out


def matches(written: str, value) -> bool:
    """Whether the table's text states ``value`` (numbers compared as numbers: ``50 000``, ``0.60``)."""
    if isinstance(value, bool) or value is None:
        return written == {None: "none", True: "true", False: "false"}[value]
    if isinstance(value, (int, float)):
        try:
            return float(written.replace(" ", "")) == float(value)
        except ValueError:
            return False
    if isinstance(value, tuple):
        return written == ", ".join(f"`{v}`" for v in value)
    return written == f"`{value}`"


DOCUMENTED = documented_defaults()


def test_the_table_lists_every_setting():
    assert set(DOCUMENTED) == {f.name for f in fields(ActivationConfig)}


@pytest.mark.parametrize("name", sorted(DOCUMENTED))
def test_each_documented_default_is_the_config_default(name):
    assert matches(DOCUMENTED[name], getattr(ActivationConfig(), name)), (name, DOCUMENTED[name])


def test_the_comparison_tells_a_stale_value():  # controls for the check itself
    assert matches("50 000", 50_000) and matches("0.60", 0.6) and matches("none", None)
    assert not matches("0", 0.7) and not matches("`lexical`, `semantic`", ("lexical", "semantic", "source"))
    assert not matches("false", 0) and not matches("abc", 1.0)
