"""Prompts for LLM-driven memory construction, written after the paper's descriptions (appendix).

The paper describes two construction prompts (atomic units with turn bounds and a triple; a retrieval
index of entities, locations and fact times). We ask for both in **one** reply per window, which keeps
construction at one call per window (0.25 calls per turn with the default step of 4). Consolidation is
one call per candidate trace.
"""

from __future__ import annotations

from collections.abc import Sequence

CONSTRUCTION_SYSTEM = """\
You turn a slice of a conversation into memory entries for a personal assistant.

Rules:
- Each entry states exactly ONE fact, event, preference, plan or state change that someone could later \
ask about. Split sentences that carry several such claims into several entries. Skip greetings, thanks, \
small talk, questions and anything without lasting information.
- Ground every entry in the turns it comes from: "turn_start" and "turn_end" are turn ids from the \
slice. Use a span of several turns only when the claim needs all of them. Turns marked CONTEXT only \
help you resolve pronouns and references; an entry must include at least one turn NOT marked CONTEXT.
- "fact" is a self-contained sentence: replace pronouns and "I"/"you" with the people's names or roles.
- "subject", "predicate", "object" form a short triple carrying the core claim (all non-empty).
- "entities": the distinctive names, products, organisations or things the entry is about (not generic words).
- "location": the place the fact happened or concerns, or "" if none is stated.
- "fact_time": WHEN THE FACT HAPPENED, not when it was said. Resolve relative expressions ("yesterday", \
"last week", "next Tuesday") against the turn's time. Write an ISO date "YYYY-MM-DD", a month \
"YYYY-MM", a year "YYYY", or an interval "start/end" of these. Use "" when the time is vague or unknown.

Reply with one JSON object and nothing else:
{"units": [{"fact": "...", "turn_start": "...", "turn_end": "...", "subject": "...", "predicate": "...", \
"object": "...", "entities": ["..."], "location": "", "fact_time": ""}]}
Reply {"units": []} when the slice holds nothing worth remembering."""

CONSOLIDATION_SYSTEM = """\
You maintain the history of one evolving piece of information in a personal memory.

You get memory entries, oldest first, that may describe the same subject and relation. Keep only the \
entries that really describe that same evolving subject-relation, in the given order. For each kept \
entry after the first, say how it relates to the state before it:
- "update": it contradicts or replaces the earlier value (the earlier one is no longer current);
- "supplement": it adds compatible detail; earlier values stay valid.
The latest supported state is the last "update" together with any later "supplement".

Reply with one JSON object and nothing else:
{"members": ["M1", "M2", ...], "transitions": {"M2": "update", "M3": "supplement"}}"""


def format_turn(label: str, speaker: str, text: str, time: str | None, context: bool) -> str:
    stamp = f" ({time})" if time else ""
    mark = " [CONTEXT]" if context else ""
    return f"[{label}]{mark}{stamp} {speaker}: {text}"


def construction_messages(turn_lines: Sequence[str], session_time: str | None = None) -> list[dict[str, str]]:
    """The chat for one window; ``turn_lines`` come from :func:`format_turn`."""
    header = f"Session time: {session_time}\n" if session_time else ""
    user = f"{header}Conversation slice:\n" + "\n".join(turn_lines)
    return [{"role": "system", "content": CONSTRUCTION_SYSTEM}, {"role": "user", "content": user}]


def retry_messages(messages: list[dict[str, str]], reply: str, error: str) -> list[dict[str, str]]:
    """Ask once more after an invalid reply, quoting the validation error."""
    return [*messages, {"role": "assistant", "content": reply[:4000]},
            {"role": "user", "content": f"Your reply was not valid: {error}\n"
                                        "Reply again with only the corrected JSON object."}]


def consolidation_messages(subject: str, relation: str, entries: Sequence[str]) -> list[dict[str, str]]:
    """The chat for one candidate trace; ``entries`` are ``"M1 (time): fact"`` lines, oldest first."""
    user = (f"Subject: {subject}\nRelation: {relation}\nEntries (oldest first):\n" + "\n".join(entries))
    return [{"role": "system", "content": CONSOLIDATION_SYSTEM}, {"role": "user", "content": user}]
