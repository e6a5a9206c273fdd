"""Typed conversation records shared by every stage (data → memory → activation → training).

All records are plain dataclasses that round-trip through JSON (``to_dict`` / ``from_dict``), so a
cache or a store never needs pickle. Times are ISO-8601 strings (``"2023-05-08T13:56:00"``) or
``None`` when the source has no timestamps (ConvoMem): then the order of turns is the only time.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass
class Turn:
    """One utterance. ``id`` is unique within its dialogue; ``index`` is its global position."""

    id: str
    session_id: str
    speaker: str
    role: str  # "user" | "assistant" | free speaker role in two-human data (LoCoMo: "speaker_a"/"speaker_b")
    text: str
    time: str | None = None  # utterance time, ISO-8601, when known
    index: int = 0


@dataclass
class Session:
    """A contiguous conversation; sessions are the hard boundaries for memory windows."""

    id: str
    turns: list[Turn] = field(default_factory=list)
    time: str | None = None  # session start time, ISO-8601, when known
    meta: dict[str, Any] = field(default_factory=dict)


@dataclass
class Dialogue:
    """A whole interaction history: ordered sessions between the same participants."""

    id: str
    sessions: list[Session] = field(default_factory=list)
    meta: dict[str, Any] = field(default_factory=dict)

    def turns(self) -> list[Turn]:
        return [t for s in self.sessions for t in s.turns]

    def turn_map(self) -> dict[str, Turn]:
        return {t.id: t for t in self.turns()}

    def num_turns(self) -> int:
        return sum(len(s.turns) for s in self.sessions)

    def reindex(self) -> None:
        """Renumber ``Turn.index`` in reading order (after sessions were interleaved)."""
        for i, turn in enumerate(self.turns()):
            turn.index = i


@dataclass
class QA:
    """A question about a dialogue, its reference answer and the gold evidence turns."""

    id: str
    question: str
    answer: str
    category: str
    evidence_turn_ids: list[str] = field(default_factory=list)
    question_time: str | None = None
    meta: dict[str, Any] = field(default_factory=dict)


@dataclass
class Case:
    """A dialogue with its questions and where it came from (dataset, file, item, person)."""

    id: str
    dialogue: Dialogue
    qas: list[QA] = field(default_factory=list)
    source: dict[str, Any] = field(default_factory=dict)

    @property
    def dataset(self) -> str:
        return str(self.source.get("dataset", ""))

    def group_key(self, key: str = "person") -> str:
        """The key that keeps related cases in one split (``person`` or ``dialogue``)."""
        if key == "dialogue":
            return self.dialogue.id
        value = self.source.get(f"{key}_id", self.source.get(key))
        if value is None:
            raise KeyError(f"case {self.id!r} has no group key {key!r} in its source metadata")
        return str(value)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Case:
        dialogue = d["dialogue"]
        sessions = [
            Session(
                id=s["id"],
                turns=[Turn(**t) for t in s["turns"]],
                time=s.get("time"),
                meta=dict(s.get("meta", {})),
            )
            for s in dialogue["sessions"]
        ]
        return cls(
            id=d["id"],
            dialogue=Dialogue(id=dialogue["id"], sessions=sessions, meta=dict(dialogue.get("meta", {}))),
            qas=[QA(**q) for q in d.get("qas", [])],
            source=dict(d.get("source", {})),
        )
