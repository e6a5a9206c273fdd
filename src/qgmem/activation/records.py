"""What query-time activation hands to the graph encoder and to the LM: the working memory."""

from __future__ import annotations

from dataclasses import dataclass, field

from qgmem.memory.records import MemoryTrace, MemoryUnit


@dataclass
class LocalGraph:
    """The local memory graph over the activated units' triples.

    Nodes are subjects/objects (de-duplicated by normalized text); edge ``j`` goes
    ``edge_index[j][0] -> edge_index[j][1]``, is labelled ``edge_text[j]`` (the predicate) and comes from working-memory entry
    ``edge_unit[j]`` (0-based position in the working memory).
    """

    node_text: list[str] = field(default_factory=list)
    edge_index: list[tuple[int, int]] = field(default_factory=list)
    edge_text: list[str] = field(default_factory=list)
    edge_unit: list[int] = field(default_factory=list)

    @property
    def num_nodes(self) -> int:
        return len(self.node_text)

    @property
    def num_edges(self) -> int:
        return len(self.edge_text)


@dataclass
class WorkingMemory:
    """The top-k activated units in reranked order, their traces, local graph and text form."""

    question: str
    units: list[MemoryUnit] = field(default_factory=list)
    scores: list[float] = field(default_factory=list)
    traces: dict[str, MemoryTrace] = field(default_factory=dict)  # trace id -> trace, for units in one
    graph: LocalGraph = field(default_factory=LocalGraph)
    text: str = ""  # the textual working memory: "[M1] ..." entries in the same order as ``units``
    constraints: object | None = None  # the parsed query (``qgmem.activation.query.QueryConstraints``)
