"""Build a ConvoMem case's history: its evidence conversations among distractor conversations.

A core ConvoMem item carries only its own evidence conversation(s) (often one of ~40 messages), which
makes retrieval trivial. ConvoMem's own pre-mixed test cases hide the evidence among other
conversations; we do the same from the core files, drawing distractors from *other items of the same
person* (so topics and persona stay consistent) with a seeded generator per case, so a case's history
does not change when other cases are added or removed from a run (given the same pool).
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from qgmem.data.records import Dialogue, Session, Turn

#: the loader's number of distractor conversations: with ~40 messages each, a history of a few hundred
#: turns, like ConvoMem's own pre-mixed cases; the histories activation is measured on (eval-retrieval,
#: build-memory, train-reranker, data-stats and the bench scripts load with it)
DEFAULT_DISTRACTORS = 6
#: distractor conversations of a training cache's histories (``distractor_conversations: null``, what
#: both presets train on): about 125 turns, so the embedded job builds its cache within its 15 minutes
TRAINING_DISTRACTORS = 2


@dataclass(frozen=True)
class Message:
    speaker: str
    role: str
    text: str


@dataclass
class Conversation:
    """A conversation as read from a file, before it becomes a :class:`Session` of some history."""

    id: str
    messages: list[Message]
    owner: str  # the item (``file#index``) the conversation belongs to
    meta: dict[str, Any] = field(default_factory=dict)


#: a conversation twice in one history: its second session is ``id~2`` (its turns ``id~2:<i>``)
REPEAT = "~"


def session_id(base: str, count: int) -> str:
    """The id of the ``count``-th session of conversation ``base`` in one history (the first keeps ``base``)."""
    return base if count == 1 else f"{base}{REPEAT}{count}"


def case_rng(seed: int, case_id: str) -> random.Random:
    """A generator that depends only on the seed and the case (string seeds hash deterministically)."""
    return random.Random(f"{seed}|{case_id}")


def draw_distractors(pool: Sequence[Conversation], owner: str, exclude_ids: set[str], n: int,
                     rng: random.Random) -> list[Conversation]:
    """``n`` conversations from ``pool`` that belong to other items (fewer if the pool is small)."""
    if n <= 0:
        return []
    candidates = [c for c in pool if c.owner != owner and c.id not in exclude_ids]
    return rng.sample(candidates, min(n, len(candidates)))


def interleave(evidence: Sequence[Any], distractors: Sequence[Any],
               rng: random.Random) -> tuple[list[Any], list[int]]:
    """Mix evidence among distractors at random positions, keeping the evidence order.

    Evidence order matters (a changed fact must come after the original); returns the mixed list and
    the positions of the evidence conversations in it.
    """
    total = len(evidence) + len(distractors)
    positions = sorted(rng.sample(range(total), len(evidence)))
    mixed: list[Conversation] = []
    ev, dis = iter(evidence), iter(distractors)
    slots = set(positions)
    for i in range(total):
        mixed.append(next(ev) if i in slots else next(dis))
    return mixed, positions


def to_dialogue(dialogue_id: str, conversations: Sequence[Conversation],
                session_meta: Sequence[dict[str, Any]] | None = None,
                meta: dict[str, Any] | None = None) -> Dialogue:
    """One session per conversation; session ids unique (``id~2`` on repeats); turn ids ``<sid>:<i>``."""
    seen: dict[str, int] = {}
    sessions: list[Session] = []
    for pos, conv in enumerate(conversations):
        base = conv.id or f"c{pos}"
        seen[base] = seen.get(base, 0) + 1
        sid = session_id(base, seen[base])
        turns = [Turn(id=f"{sid}:{i}", session_id=sid, speaker=m.speaker, role=m.role, text=m.text)
                 for i, m in enumerate(conv.messages)]
        extra = dict(session_meta[pos]) if session_meta is not None else {}
        sessions.append(Session(id=sid, turns=turns, meta={**conv.meta, **extra}))
    dialogue = Dialogue(id=dialogue_id, sessions=sessions, meta=dict(meta or {}))
    dialogue.reindex()
    return dialogue
