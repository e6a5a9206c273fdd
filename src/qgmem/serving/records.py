"""What serving hands back: a question after activation (:class:`Retrieved`) and its :class:`Answer`.

Shared by both backbones (the graph-token pipeline and the API backbone), so neither imports the
other's module for them; also the JSON forms of the working memory and the local graph an answer
carries, and the citation rule (``[M3]`` labels the answer names).
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from qgmem.model.graph_modes import GRAPH_MODES  # noqa: F401  importable from here as before

if TYPE_CHECKING:
    from torch_geometric.data import Data

    from qgmem.activation.records import LocalGraph, WorkingMemory
    from qgmem.memory.records import MemoryTrace, MemoryUnit

_CITATION = re.compile(r"\[M(\d+)\]")


@dataclass
class Retrieved:
    """One question after activation: its working memory and the local graph's features."""

    question: str
    memory: WorkingMemory
    graph: Data
    seconds: dict[str, float] = field(default_factory=dict)
    question_time: str | None = None
    store_units: int = 0  # units in the memory it was activated from (0: an empty history)
    max_new_tokens: int | None = None  # this question's answer cap (None: the pipeline's; never above it)


@dataclass
class Answer:
    """An answer with what it rests on and what it cost.

    ``cited``: the memory labels (``M3``) the answer names; ``memory``: every working-memory entry the
    LM saw (label, unit id, fact, times, score); ``graph``: the local graph (nodes, edges with the entry
    each comes from); ``seconds`` per stage; ``tokens``: retrieved context (memory text in the prompt),
    prompt, graph tokens, generated, and their total (the online tokens of this QA).
    """

    question: str
    answer: str
    graph_mode: str
    cited: list[str] = field(default_factory=list)
    memory: list[dict[str, Any]] = field(default_factory=list)
    graph: dict[str, Any] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)
    tokens: dict[str, int] = field(default_factory=dict)
    memory_tokens_dropped: int = 0
    error: str | None = None  # a failed backend request (API backbone): the answer is empty
    finish_reason: str = "stop"  # "length" when generation hit the token cap before its end
    #: the raw reply's degenerate shape before the answer cut repaired it (``empty``, ``lead_in``, ``entry``;
    #: ``None``: an answer), :func:`qgmem.prompting.reply_shape`; eval-qa counts them per graph mode
    reply_shape: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def graph_json(graph: LocalGraph) -> dict[str, Any]:
    """Nodes and labelled edges; ``memory`` is the working-memory label the edge's triple comes from."""
    return {"nodes": list(graph.node_text),
            "edges": [{"source": int(h), "target": int(t), "relation": rel, "memory": f"M{pos + 1}"}
                      for (h, t), rel, pos in zip(graph.edge_index, graph.edge_text, graph.edge_unit)]}


def memory_json(memory: WorkingMemory) -> list[dict[str, Any]]:
    return [{"label": f"M{i + 1}", "unit_id": u.id, "fact": u.fact, "speaker": u.speaker,
             "fact_time": u.fact_time, "utterance_time": u.utterance_time, "source_turn_ids": list(u.source_turn_ids),
             "score": round(float(s), 4)}
            for i, (u, s) in enumerate(zip(memory.units, memory.scores or [0.0] * len(memory.units)))]


def unit_json(unit: MemoryUnit, trace: MemoryTrace | None) -> dict[str, Any]:
    """One memory unit as the service shows it: its text, times, source and its trace's state (how the
    unit relates to the state before it, and whether it is the trace's latest, i.e. current, one)."""
    state = None
    if trace is not None and unit.id in trace.unit_ids:
        i = trace.unit_ids.index(unit.id)
        state = {"trace_id": trace.id, "subject": trace.subject, "relation": trace.relation,
                 "transition": trace.transitions[i] if i < len(trace.transitions) else None,
                 "position": i, "length": len(trace.unit_ids), "current": unit.id == trace.latest_unit_id}
    return {"unit_id": unit.id, "fact": unit.fact, "speaker": unit.speaker, "fact_time": unit.fact_time,
            "utterance_time": unit.utterance_time, "session_id": unit.session_id,
            "source_turn_ids": list(unit.source_turn_ids), "trace": state}


def cited_labels(answer: str, num_entries: int) -> list[str]:
    """``[M2]``-style labels the answer names, in order, only those that exist."""
    seen = []
    for m in _CITATION.finditer(answer):
        label = f"M{int(m.group(1))}"
        if 1 <= int(m.group(1)) <= num_entries and label not in seen:
            seen.append(label)
    return seen
