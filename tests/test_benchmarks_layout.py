"""docs/BENCHMARKS.md stays a reference: every section with figures names its command, date and commit.

The page grew into a diary of tuning rounds once (808 → 3,326 lines); the rounds now live in
docs/history/. What keeps the page a reference is that each table of figures sits in a section that
says how to reproduce it and when it was recorded, in the layout the page's introduction describes.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BENCHMARKS = ROOT / "docs" / "BENCHMARKS.md"

TABLE_RULE = re.compile(r"^\|\s*-{3,}", re.M)
RECORDED = re.compile(r"\*\*Recorded\*\*:(.*?)(?=\*\*|\n\n|$)", re.S)  # up to the next bold or paragraph
DATE = re.compile(r"\b20\d\d-\d\d-\d\d\b")
COMMIT = re.compile(r"\b[0-9a-f]{7,40}\b")


def sections(text: str) -> dict[str, str]:
    parts = re.split(r"^## (.+)$", text, flags=re.M)
    return dict(zip(parts[1::2], parts[2::2]))


def unsourced_sections(text: str) -> list[str]:
    """The `## ` sections that hold a table but no command, or no recorded date and commit."""
    missing = []
    for title, body in sections(text).items():
        if not TABLE_RULE.search(body):
            continue
        if "**Command**" not in body:
            missing.append(f"{title}: no **Command**")
        recorded = RECORDED.findall(body)
        if not recorded or not all(DATE.search(r) and COMMIT.search(r) for r in recorded):
            missing.append(f"{title}: no **Recorded**: with a date (YYYY-MM-DD) and a commit")
    return missing


def test_every_section_with_figures_names_its_command_date_and_commit() -> None:
    assert unsourced_sections(BENCHMARKS.read_text(encoding="utf-8")) == []


def round_mentions(text: str) -> list[str]:
    return re.findall(r"(?i)\bround \d+\b", text)


def test_the_tuning_rounds_stay_in_the_history() -> None:
    assert round_mentions(BENCHMARKS.read_text(encoding="utf-8")) == []
    assert round_mentions("chosen in Round 8, kept in round 12 (a rounding)") == ["Round 8", "round 12"]


def test_the_check_finds_a_table_without_its_source() -> None:
    made_up = (
        "# Benchmarks\n\n## Sourced\n\n**Command**: `python bench/x.py`. **Recorded**: 2026-12-01, abc1234.\n\n"
        "| a | b |\n| --- | --- |\n| 1 | 2 |\n\n"
        "## Prose only\n\nNo table here.\n\n"
        "## Unsourced\n\n| a | b |\n| --- | --- |\n| 1 | 2 |\n\n"
        "## Undated\n\n**Command**: `python bench/y.py`. **Recorded**: abc1234.\n\n| a |\n| --- |\n| 1 |\n"
        "## No commit\n\n**Command**: `python bench/z.py`. **Recorded**: 2026-12-01.\n\n| a |\n| --- |\n| 1 |\n"
    )
    assert unsourced_sections(made_up) == [
        "Unsourced: no **Command**",
        "Unsourced: no **Recorded**: with a date (YYYY-MM-DD) and a commit",
        "Undated: no **Recorded**: with a date (YYYY-MM-DD) and a commit",
        "No commit: no **Recorded**: with a date (YYYY-MM-DD) and a commit",
    ]
