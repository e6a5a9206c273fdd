"""``Memory``: one dialogue's memory as questions read it: its store, the trace index, the activator.

Construction (:mod:`qgmem.memory`) writes a store; activation reads it. Every caller that answers
questions over a dialogue holds the same three things side by side: the store, the trace neighbour
lists an append extends (:class:`~qgmem.memory.traces.TraceIndex`), and the
:class:`~qgmem.activation.activator.Activator` over the store. ``Memory`` holds them for all of them
(``qgmem answer``, each user of ``qgmem serve``, ``qgmem eval-qa`` and the sample build), and
:meth:`Memory.recall` is the one place where a question is activated and its local graph turned
into the graph encoder's features.

It lives in ``activation`` because that is the lowest layer that holds everything it uses (the
store and builder below, the activator and the graph here), so the sample build can use it as
serving does. (The package :mod:`qgmem.memory` is construction; this module is the memory at query
time.)
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, NamedTuple, Sequence

from qgmem.activation.config import ActivationConfig
from qgmem.activation.records import WorkingMemory

if TYPE_CHECKING:
    from torch_geometric.data import Data

    from qgmem.activation.activator import Activator
    from qgmem.data.records import Dialogue, Session
    from qgmem.memory.builder import Extraction, MemoryBuilder
    from qgmem.memory.store import MemoryStore


class Recall(NamedTuple):
    """One question recalled from a memory: its working memory, the local graph's features, and the
    seconds of the two steps (``activation``, ``graph_features``)."""

    working_memory: WorkingMemory
    graph: Data
    seconds: dict[str, float]


class Memory:
    """A store with its trace index and its activator (built on the first question, see :attr:`activator`).

    ``encoder``: the sentence encoder the store was built with; ``reranker``: a model reranker shared
    by many memories (:func:`~qgmem.activation.rerank.shared_reranker`; ``None`` for the embedding
    one, which each activator builds over its own store); ``llm``: the backend of an LLM query parser.
    ``trace_index``: the store's trace neighbour lists when construction just built them (``None``:
    rebuilt from the store at the first append). ``seconds``: what construction took (``construction``).
    """

    def __init__(self, store: MemoryStore, encoder: Any, activation: ActivationConfig | None = None, *,
                 reranker: Any = None, llm: Any = None, trace_index: Any = None,
                 seconds: dict[str, float] | None = None):
        self.store = store
        self.encoder = encoder
        self.activation = activation or ActivationConfig()
        self.reranker, self.llm = reranker, llm
        self.trace_index = trace_index
        self.seconds = dict(seconds or {})
        self._activator: Activator | None = None
        # an earlier memory of this line whose activator the first question here extends (see appended())
        self._grown_from: Memory | None = None

    # ---------------------------------------------------------------------------------- construction
    @classmethod
    def build(cls, builder: MemoryBuilder, dialogue: Dialogue, activation: ActivationConfig | None = None, *,
              reranker: Any = None, extraction: Extraction | None = None) -> Memory:
        """The memory of ``dialogue``, constructed by ``builder`` (``extraction``: its LLM extraction when
        it was run ahead, :meth:`~qgmem.memory.builder.MemoryBuilder.extract`)."""
        started = time.perf_counter()
        index: list = []
        store = builder.build(dialogue, extraction, index_out=index)
        return cls(store, builder.encoder, activation, reranker=reranker, llm=builder.llm, trace_index=index[0],
                   seconds={"construction": time.perf_counter() - started})

    def appended(self, builder: MemoryBuilder, sessions: Sequence[Session]) -> Memory:
        """A new memory: this one with ``sessions`` appended (:meth:`~qgmem.memory.builder.MemoryBuilder.append`:
        new units, traces regrouped, the trace index extended; the earlier history is not rebuilt).

        This memory is left as it was, so a caller can drop the new one (a failed commit) and
        go on with this one. The new memory's first question extends this one's activator instead of
        building another (its dense indexes gain the new rows); this one then builds a fresh activator
        if it is ever asked again.
        """
        started = time.perf_counter()
        store, index = builder.append(self.store, list(sessions), self.trace_index)
        grown = Memory(store, self.encoder, self.activation, reranker=self.reranker, llm=self.llm,
                       trace_index=index, seconds={"construction": time.perf_counter() - started})
        # the memory holding the activator to extend: this one, or the one this was grown from (a chain
        # of appends with no question between them keeps only that one alive, not every store)
        grown._grown_from = self if self._activator is not None else self._grown_from
        return grown

    def __len__(self) -> int:
        return len(self.store)

    # ------------------------------------------------------------------------------------ activation
    @property
    def activator(self) -> Activator | None:
        """The activator over the store (``None`` for an empty one), built at first use."""
        if self._activator is None and len(self.store):
            from qgmem.activation.activator import Activator

            earlier, self._grown_from = self._grown_from, None
            base = earlier._activator if earlier is not None else None
            if base is not None and base.store is not self.store:
                earlier._activator = None  # extended in place below: unusable for its own store
                self._activator = base.extended(self.store, reranker=self.reranker)
            else:
                self._activator = Activator(self.store, self.encoder, self.activation, reranker=self.reranker,
                                            llm=self.llm)
        return self._activator

    def activate(self, question: str, question_time: str | None = None) -> WorkingMemory:
        """The working memory of ``question`` (an empty one when the store holds nothing)."""
        activator = self.activator
        return WorkingMemory(question=question) if activator is None else activator.activate(question, question_time)

    def recall(self, question: str, question_time: str | None = None, *, facts: bool = True) -> Recall:
        """Activate ``question``, then the local graph's features (:func:`~qgmem.activation.graph.graph_to_data`).

        ``facts``: the graph also carries each edge's unit fact (``edge_fact``), as the sample build
        and the encoders that read facts need. Building the activator is not counted in ``seconds``.
        """
        from qgmem.activation.graph import graph_to_data

        _ = self.activator  # built (or extended) outside the timed activation
        t0 = time.perf_counter()
        working = self.activate(question, question_time)
        t1 = time.perf_counter()
        graph = graph_to_data(working.graph, self.encoder, facts=[u.fact for u in working.units] if facts else None)
        return Recall(working, graph, {"activation": t1 - t0, "graph_features": time.perf_counter() - t1})
