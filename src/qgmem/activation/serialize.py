"""Text forms of the working memory: labelled entries for the LM, triples for closed-embedding backbones.

The entry order is the reranked order, the same order the local graph's ``edge_unit`` refers to, so
``[M3]`` in the text and edges from entry 2 in the graph are the same unit.
"""

from __future__ import annotations

from qgmem.activation.records import LocalGraph
from qgmem.memory.records import MemoryUnit
from qgmem.prompting import entries


def _date(value: str | None) -> str:
    return (value or "")[:10]


def turn_label(unit: MemoryUnit) -> str:
    """``turn 12`` or ``turns 12-13``: positions in the dialogue (ids like UUIDs would cost ~20 tokens each)."""
    return entries.turn_label(unit.order, len(unit.source_turn_ids))


def _trajectory(unit: MemoryUnit, store, max_states: int, labels: dict[str, int] | None = None,
                shown: dict[str, int] | None = None) -> str:
    """`` Trajectory: origin: ... -> update, current: ...`` for a unit in a trace of two or more states.

    States that are entries of this working memory are cited by label (``[M3]``) instead of repeating
    their fact, and a trace already printed for an earlier entry is only referred to: trajectories are
    what would otherwise dominate the token budget.
    """
    trace = store.trace_of(unit) if store is not None else None
    if trace is None or len(trace.unit_ids) < 2:
        return ""
    labels = labels or {}
    if shown is not None:
        if trace.id in shown:
            return f" Trajectory: see {entries.label(shown[trace.id])}."
        shown[trace.id] = labels.get(unit.id, 0)
    states = []
    for uid, transition in zip(trace.unit_ids, trace.transitions):
        if uid == unit.id:
            label = "this entry"
        elif uid in labels:
            label = entries.label(labels[uid])
        else:
            label = store.unit(uid).fact.strip().rstrip(".")
        mark = ", current" if uid == trace.latest_unit_id else ""
        states.append(f"{transition}{mark}: {label}")
    dropped = len(states) - max_states
    if dropped > 0:
        states = [f"{dropped} earlier"] + states[-max_states:]
    return " Trajectory: " + " -> ".join(states) + "."


def serialize_unit(position: int, unit: MemoryUnit, store=None, *, source_chars: int = 0, max_states: int = 3,
                   labels: dict[str, int] | None = None, shown: dict[str, int] | None = None) -> str:
    """``[M{position}] fact (speaker; turn i; happened <fact time>; said <date>) Trajectory: ... Source: ...``."""
    meta = entries.provenance(unit.speaker, turn_label(unit), unit.fact_time,
                              _date(unit.utterance_time) if unit.utterance_time else None)
    text = entries.entry(position, unit.fact.strip(), meta)
    text += _trajectory(unit, store, max_states, labels, shown)
    if source_chars > 0 and unit.source_text.strip():
        source = " ".join(unit.source_text.split())
        text += f" Source: \"{source[:source_chars]}{'...' if len(source) > source_chars else ''}\""
    return text


def serialize_working_memory(units: list[MemoryUnit], store=None, *, source_chars: int = 0, max_states: int = 3) -> str:
    """The textual working memory: one ``[Mi]`` line per unit in the given (reranked) order.

    ``store`` (a ``MemoryStore``) supplies trace trajectories (the last ``max_states`` states, printed once
    per trace); without it entries carry no trajectory. ``source_chars`` > 0 appends that many characters
    of the source dialogue span per entry.
    """
    labels = {u.id: i + 1 for i, u in enumerate(units)}
    shown: dict[str, int] = {}
    return "\n".join(serialize_unit(i + 1, u, store, source_chars=source_chars, max_states=max_states,
                                    labels=labels, shown=shown) for i, u in enumerate(units))


def serialize_graph_triples(graph: LocalGraph) -> str:
    """The local graph as ``(subject; predicate; object) [Mi]`` lines, for backbones without a graph token."""
    lines = []
    for (head, tail), label, position in zip(graph.edge_index, graph.edge_text, graph.edge_unit):
        lines.append(f"({graph.node_text[head]}; {label}; {graph.node_text[tail]}) [M{position + 1}]")
    return "\n".join(lines)


def count_tokens(text: str, tokenizer) -> int:
    """Tokens of ``text`` under ``tokenizer`` (no special tokens), the budget the frozen LM actually sees."""
    return len(tokenizer.encode(text, add_special_tokens=False)) if text else 0
