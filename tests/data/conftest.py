"""Builders of tiny on-disk data sets for the data-layer tests (bad input is written on purpose)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
PERSON = "person-1"


def convomem_item(n: int, person: str = PERSON, n_messages: int = 4) -> dict:
    """A valid core ConvoMem evidence item whose evidence is the user's second message."""
    messages = []
    for k in range(n_messages):
        speaker = "User" if k % 2 == 0 else "Assistant"
        messages.append({"speaker": speaker, "text": f"item {n} message {k}: about topic {n}, café №{k}"})
    return {
        "question": f"What about topic {n}?",
        "answer": f"topic {n}",
        "message_evidences": [{"speaker": "User", "text": messages[2]["text"]}],
        "conversations": [{"messages": messages, "id": f"conv-{person}-{n}", "containsEvidence": True,
                           "model_name": None}],
        "category": "Professional Life",
        "scenario_description": f"Scenario {n}.",
        "personId": person,
        "use_case_model_name": None,
        "core_model_name": "gpt-4o",
    }


def write_core(root: Path, category: str, items: list[dict] | str, person: str = PERSON,
               n_evidence: int = 1) -> Path:
    """Write one core file; ``items`` as a string is written verbatim (for malformed JSON)."""
    folder = root / "core_benchmark" / "evidence_questions" / category / f"{n_evidence}_evidence"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{person}_Tester.json"
    text = items if isinstance(items, str) else json.dumps({"evidence_items": items, "checkpoint": "x"},
                                                            ensure_ascii=False)
    path.write_text(text, encoding="utf-8")
    return path


@pytest.fixture
def tiny_convomem(tmp_path: Path) -> Path:
    """Two categories, two persons, 10 items in all: enough for distractors and grouped splits."""
    for person in ("person-1", "person-2"):
        write_core(tmp_path, "user_evidence", [convomem_item(i, person) for i in range(3)], person)
        write_core(tmp_path, "preference_evidence", [convomem_item(10 + i, person) for i in range(2)], person)
    return tmp_path


@pytest.fixture
def locomo_file() -> Path:
    return FIXTURES / "locomo_small.json"


@pytest.fixture
def longmemeval_file() -> Path:
    return FIXTURES / "longmemeval_small.json"


@pytest.fixture
def premixed_root() -> Path:
    return FIXTURES / "convomem_premixed"


@pytest.fixture
def fixture_copy(tmp_path: Path):
    """Copy a fixture file into tmp_path (to damage it) and return the copy's path."""
    def copy(name: str) -> Path:
        dest = tmp_path / name
        shutil.copy(FIXTURES / name, dest)
        return dest
    return copy
