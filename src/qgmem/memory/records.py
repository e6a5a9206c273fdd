"""Records of offline memory construction: atomic memory units and dynamic memory traces."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass
class MemoryUnit:
    """One independently retrievable, source-grounded claim (an *event-indexed atomic unit*).

    ``fact_time`` is when the fact happened (ISO date ``2023-05-01`` or interval
    ``2023-05-01/2023-05-07``, empty when vague); ``utterance_time`` is when it was said. They are kept
    apart on purpose: "last week I moved" said on 8 May has fact time ~1 May.
    ``source_turn_ids`` is the grounding span (first..last turn id, inclusive); it is what retrieval
    evaluation maps a unit back to, so it must be no wider than the claim needs.
    """

    id: str
    dialogue_id: str
    session_id: str
    window_id: str
    fact: str
    subject: str
    predicate: str
    object: str
    source_turn_ids: list[str]
    source_text: str
    speaker: str = ""
    entities: list[str] = field(default_factory=list)
    location: str = ""
    fact_time: str = ""
    utterance_time: str | None = None
    order: int = 0  # memory time order within the dialogue (turn index of the first source turn)
    trace_id: str | None = None
    # further [head, relation, tail] triples of the same claim (the parser extractor's extra edges:
    # "chat | with | R&D lead", "Omar | is | User's manager"); the main triple is subject/predicate/object
    relations: list[list[str]] = field(default_factory=list)

    @property
    def turn_start(self) -> str:
        return self.source_turn_ids[0]

    @property
    def turn_end(self) -> str:
        return self.source_turn_ids[-1]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> MemoryUnit:
        return cls(**d)


@dataclass
class MemoryTrace:
    """Units that describe one evolving subject–relation, ordered by memory time.

    ``transitions[i]`` says how unit ``unit_ids[i]`` relates to the state before it: ``"origin"`` for
    the first, then ``"update"`` (incompatible new value: supersedes) or ``"supplement"`` (compatible
    addition). ``latest_unit_id`` is the latest supported state.
    """

    id: str
    dialogue_id: str
    subject: str
    relation: str
    unit_ids: list[str]
    transitions: list[str]
    latest_unit_id: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> MemoryTrace:
        return cls(**d)
