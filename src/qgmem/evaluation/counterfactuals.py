"""The graph-token study's counterfactual graphs, in a table of their own beside the training cache.

The product trains on each question's own graph. The study asks whether that graph's evidence matters by
scoring the same weights with two other graphs of the same question (:mod:`qgmem.evaluation.protocol`):

- **ablated**: the question activated again over the store without the units grounded in its gold
  evidence turns (:func:`~qgmem.evaluation.ablate.evidence_unit_ids`, traces rebuilt). None when the
  question has no gold evidence, the store no unit grounded in it, or the graph comes out equal to the
  own one (:data:`STATUSES`, :func:`evidence_ablation`);
- **sham**, its control, only beside an ablated graph: as many non-evidence units removed, at the
  evidence's ranks of the own working memory where possible
  (:func:`~qgmem.evaluation.ablate.sham_unit_ids`, seeded by the question's id).

They are built by replaying the cache's plan through the sample build's per-question hook
(``Replayer.rows(..., on_question=)``), so they are compared with exactly the cached own graph, and kept
as a table keyed by question id: ``counterfactuals-<samples key>/`` next to ``samples-<samples key>/``,
one Arrow shard per case of the plan, resumable like the samples. A training row holds one graph; the
study changes no cache format. ``eval-qa --graph-modes ablated`` decides its ablated graph with the same
:func:`evidence_ablation`.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Callable, Iterable, TypeVar

from qgmem.activation.graph import graph_signature
from qgmem.evaluation.ablate import evidence_only_nodes, evidence_unit_ids, sham_unit_ids, without_units
from qgmem.samples import cache as C

T = TypeVar("T")

#: why a question has no evidence-ablated graph ("" when it has one)
NO_GOLD_EVIDENCE = "no_gold_evidence"
NO_EVIDENCE_UNIT = "no_evidence_unit_in_store"
UNCHANGED = "ablated_graph_unchanged"
STATUSES = (NO_GOLD_EVIDENCE, NO_EVIDENCE_UNIT, UNCHANGED)
#: the two counterfactual graphs, each stored as ``<name>_<graph column>``
GRAPHS = ("ablated", "sham")
#: what the ablation removed: units of the store and of the own working memory grounded in gold
#: evidence, the own graph's nodes that only evidence units give, how many of those the ablated graph kept
ABLATION_COUNTS = ("store_evidence_units", "memory_evidence_units", "evidence_nodes", "evidence_nodes_kept")
#: what the sham removed: units, how many of them rank-matched, how many it could not remove
SHAM_COUNTS = ("sham_units", "sham_rank_matched", "sham_short")


def evidence_ablation(units: Iterable[Any], qa: Any, own_graph: Any, activate_without: Callable[[frozenset[str]], T],
                      graph_of: Callable[[T], Any] = lambda result: result) -> tuple[T | None, set[str], str]:
    """``(result, removed unit ids, status)`` of the evidence ablation of ``qa`` over a store's ``units``.

    ``activate_without(drop)`` activates the question over the store without the units ``drop`` and
    returns its result, whose graph ``graph_of`` gives. The result is ``None`` with one of
    :data:`STATUSES` when there is no ablated graph; the status is ``""`` when there is one.
    """
    if not qa.evidence_turn_ids:
        return None, set(), NO_GOLD_EVIDENCE
    drop = evidence_unit_ids(units, qa.evidence_turn_ids)
    if not drop:
        return None, drop, NO_EVIDENCE_UNIT
    result = activate_without(frozenset(drop))
    if graph_signature(graph_of(result)) == graph_signature(own_graph):
        return None, drop, UNCHANGED
    return result, drop, ""


# --------------------------------------------------------------------------------------------------
# the table


def table_features():
    """The Arrow schema of one question's counterfactuals: its id, both graphs' columns and their counts."""
    from datasets import Features, List, Value

    columns: dict[str, Any] = {"qa_id": Value("string")}
    for name in GRAPHS:
        columns[name] = Value("bool")
        columns.update({f"{name}_{k}": v for k, v in C.graph_features().items() if k != "feature_dim"})
        columns[f"{name}_node_text"] = List(Value("string"))
        columns[f"{name}_edge_unit"] = List(Value("int32"))  # each edge's working-memory position
    columns["feature_dim"] = Value("int32")
    columns["ablation_status"] = Value("string")
    columns.update({k: Value("int32") for k in (*ABLATION_COUNTS, *SHAM_COUNTS)})
    return Features(columns)


def table_row(qa_id: str, feature_dim: int, *, ablated: Any = None, ablated_text: Iterable[str] = (),
              ablation: dict[str, Any] | None = None, sham: Any = None, sham_text: Iterable[str] = (),
              sham_info: dict[str, Any] | None = None) -> dict[str, Any]:
    """One row of the table: each graph's columns (empty, and ``<name>`` False, without it) and the counts."""
    info = {k: 0 for k in (*ABLATION_COUNTS, *SHAM_COUNTS)}
    info.update({k: v for k, v in (ablation or {}).items() if k in ABLATION_COUNTS})
    info.update({k: v for k, v in (sham_info or {}).items() if k in SHAM_COUNTS})
    status = "" if ablated is not None else (ablation or {}).get("ablation_status") or "none"
    row: dict[str, Any] = {"qa_id": qa_id, "feature_dim": int(feature_dim), "ablation_status": status, **info}
    for name, graph, texts in (("ablated", ablated, ablated_text), ("sham", sham, sham_text)):
        row[name] = graph is not None
        columns = C.graph_columns(graph, feature_dim, node_text=list(texts), where=f"qa {qa_id}, {name} graph") \
            if graph is not None else {"num_nodes": 0, "num_edges": 0, "x": [], "edge_index": [], "edge_attr": [],
                                       "edge_fact": []}
        row.update({f"{name}_{k}": v for k, v in columns.items() if k != "feature_dim"})
        row[f"{name}_node_text"] = list(texts) if graph is not None else []
        units = getattr(graph, "edge_unit", None)
        row[f"{name}_edge_unit"] = [int(u) for u in units] if units is not None else None
    return row


def to_item(row: dict[str, Any]) -> dict[str, Any]:
    """A table row to what the protocol scores: ``ablated_graph``/``ablated_node_text`` and
    ``sham_graph``/``sham_node_text``, each only when the question has that graph; each edge's
    working-memory position (``edge_unit``) goes with its graph where the table recorded it (tables
    written before it was recorded have none)."""
    item: dict[str, Any] = {}
    for name in GRAPHS:
        if row.get(name):
            item[f"{name}_graph"] = C.row_to_data({k: row[f"{name}_{k}"] for k in (
                "num_nodes", "num_edges", "x", "edge_index", "edge_attr", "edge_fact")} | {"feature_dim": row["feature_dim"]}
                | ({"edge_unit": row[f"{name}_edge_unit"]} if row.get(f"{name}_edge_unit") is not None else {}))
            item[f"{name}_node_text"] = list(row.get(f"{name}_node_text") or [])
    return item


# --------------------------------------------------------------------------------------------------
# the hook of the sample build


class Counterfactuals:
    """``Replayer.rows``' ``on_question`` hook: each question's ablated and sham graphs, as table rows.

    Uses the replayer's encoder, activation settings, reranker and LLM, so the graphs are built as the
    own one was. The stores without a case's evidence units are built once per distinct evidence set.
    """

    def __init__(self, replayer: Any):
        self.replayer = replayer
        self.rows: list[dict[str, Any]] = []
        self._store: Any = None
        self._ablated: dict[frozenset[str], Any] = {}

    def __call__(self, store: Any, qa: Any, when: str | None, memory: Any, data: Any) -> None:
        ablated, ablated_text, ablation, _ = self.ablated(store, qa, when, memory, data)
        sham, sham_text, sham_info = (self.sham(store, qa, when, memory) if ablated is not None
                                      else (None, [], None))
        self.rows.append(table_row(qa.id, self.replayer.encoder.dim, ablated=ablated, ablated_text=ablated_text,
                                   ablation=ablation, sham=sham, sham_text=sham_text, sham_info=sham_info))

    def take(self) -> list[dict[str, Any]]:
        """The rows since the last call (one case's, when called after each case)."""
        rows, self.rows = self.rows, []
        return rows

    def _memory(self, store: Any, drop: set[str]) -> Any:
        """The memory of ``store`` without the units ``drop`` (traces rebuilt), activated as the own one was."""
        from qgmem.activation.memory import Memory

        r = self.replayer
        llm = r.llm if r.builder.uses_llm_consolidation else None
        reduced = without_units(store, drop, r.encoder.encode, r.spec.construction, llm=llm)
        return Memory(reduced, r.encoder, r.spec.activation, reranker=r.reranker, llm=r.llm)

    @staticmethod
    def _recall(memory: Any, qa: Any, when: str | None) -> tuple[Any, Any]:
        working, graph, _ = memory.recall(qa.question, when)
        return graph, working

    def ablated(self, store: Any, qa: Any, when: str | None, memory: Any, data: Any
                ) -> tuple[Any, list[str], dict[str, Any], Any]:
        """The evidence-ablated graph of ``qa`` (or ``None``), its node texts, what the ablation removed
        and the ablated working memory (``None`` without one)."""
        if store is not self._store:  # a new case: its evidence sets' stores start afresh
            self._store, self._ablated = store, {}

        def activate_without(drop: frozenset[str]) -> tuple[Any, Any]:
            if drop not in self._ablated:
                self._ablated[drop] = self._memory(store, set(drop))
            return self._recall(self._ablated[drop], qa, when)

        result, drop, status = evidence_ablation(store.units, qa, data, activate_without, graph_of=lambda r: r[0])
        info: dict[str, Any] = {"ablation_status": status}
        if drop:
            info.update(store_evidence_units=len(drop), memory_evidence_units=sum(u.id in drop for u in memory.units))
        if result is None:
            return None, [], info, None
        other_data, other = result
        evidence_nodes = evidence_only_nodes(memory.graph, memory.units, drop)
        kept = evidence_nodes & {t.strip().casefold() for t in other.graph.node_text}
        texts = list(getattr(other_data, "node_text", other.graph.node_text))
        return other_data, texts, {**info, "evidence_nodes": len(evidence_nodes), "evidence_nodes_kept": len(kept)}, other

    def sham(self, store: Any, qa: Any, when: str | None, memory: Any) -> tuple[Any, list[str], dict[str, Any]]:
        """The sham-ablated graph of ``qa``, its node texts and what the sham removed (only beside an
        ablated graph, so that the two contrasts score the same questions)."""
        drop = evidence_unit_ids(store.units, qa.evidence_turn_ids)
        remove, info = sham_unit_ids(store.units, memory.units, drop, seed=qa.id)
        data, other = self._recall(self._memory(store, remove), qa, when)
        return data, list(getattr(data, "node_text", other.graph.node_text)), info


# --------------------------------------------------------------------------------------------------
# the table of a cache


def table_dir(spec: Any) -> Path:
    """``counterfactuals-<samples key>/`` beside the cache's samples (same settings, same plan)."""
    return Path(spec.cache_dir) / f"counterfactuals-{spec.samples_key}"


def build(spec: Any, *, encoder: Any = None, progress: bool = True) -> C.SampleCache:
    """Replay the plan of ``spec``'s cache through :class:`Counterfactuals`; one shard per case not yet
    written (an interrupted build goes on where it stopped). ``encoder`` replaces the configured sentence
    encoder (tests). Returns the table, complete."""
    from tqdm.auto import tqdm

    from qgmem.samples.build import Replayer, plan_cases

    table = C.SampleCache(table_dir(spec), features=table_features())
    if table.complete and not table.damaged_shards(len(table.plan())):
        return table
    plan, _ = plan_cases(spec)
    table.start({"samples_key": spec.samples_key}, [{"split": s, "case_id": c.id} for s, c in plan])
    for index in table.damaged_shards(len(plan)):
        table.remove_shard(index)
    todo = [i for i in range(len(plan)) if not table.has_shard(i)]
    replayer = Replayer(spec, encoder)
    hook = Counterfactuals(replayer)
    started = time.perf_counter()
    try:
        for index in tqdm(todo, desc="counterfactuals: cases", unit="case", disable=not progress):
            split, case = plan[index]
            replayer.rows(split, case, on_question=hook)
            table.write_shard(index, hook.take(), {"case_id": case.id, "split": split})
    finally:
        replayer.close()
    table.mark_complete({"cases": len(plan), "built": len(todo), "seconds": round(time.perf_counter() - started, 2)})
    return table


def load(spec: Any, *, encoder: Any = None, progress: bool = True) -> dict[str, dict[str, Any]]:
    """``qa_id -> {ablated_graph, ablated_node_text, sham_graph, sham_node_text}`` (those it has) for every
    question of ``spec``'s cache, building the table first when it is not complete."""
    rows = build(spec, encoder=encoder, progress=progress).load()
    return {row["qa_id"]: to_item(row) for row in rows}


__all__ = ["ABLATION_COUNTS", "Counterfactuals", "GRAPHS", "NO_EVIDENCE_UNIT", "NO_GOLD_EVIDENCE", "SHAM_COUNTS",
           "STATUSES", "UNCHANGED", "build", "evidence_ablation", "load", "table_dir", "table_features", "table_row",
           "to_item"]
