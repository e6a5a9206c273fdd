"""Offline construction for one dialogue: windows → atomic units → fact embeddings → traces → store."""

from __future__ import annotations

import copy
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from qgmem.data.records import Dialogue, Session
from qgmem.errors import UserError
from qgmem.llm.base import LLMBackend
from qgmem.memory.config import MAX_FAILED_WINDOW_SHARE, ConstructionConfig
from qgmem.memory.extract_heuristic import HeuristicExtractor
from qgmem.memory.extract_llm import LLMExtractor
from qgmem.memory.extract_parser import ParserExtractor
from qgmem.memory.records import MemoryUnit
from qgmem.memory.source_turns import source_turn_embeddings
from qgmem.older_records import stored_source_label
from qgmem.memory.store import STORE_FORMAT_VERSION, MemoryStore
from qgmem.memory.traces import TraceIndex, build_traces
from qgmem.memory.windows import Window, make_windows


@dataclass
class BuildStats:
    """Cumulative counts over every :meth:`MemoryBuilder.build` call of one builder.

    ``llm_requests`` counts every prompt sent (a cache hit included); ``llm_calls`` only those that
    reached the model, and the token counts are for those calls.
    """

    dialogues: int = 0
    turns: int = 0
    windows: int = 0
    units: int = 0
    traces: int = 0
    updates: int = 0
    supplements: int = 0
    skipped_windows: int = 0
    unavailable_windows: int = 0  # of the skipped: no reply at all (server unreachable, retries spent)
    skip_reasons: Counter = field(default_factory=Counter)
    retried_windows: int = 0
    overlap_only_units: int = 0
    consolidation_fallbacks: int = 0
    llm_requests: int = 0
    llm_calls: int = 0
    llm_cache_hits: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    seconds: float = 0.0
    skipped_examples: list[str] = field(default_factory=list)  # first few "window: reason" lines
    # rule extractors: what became of each sentence, "role/outcome" (extract_heuristic.SENTENCE_OUTCOMES)
    sentences: Counter = field(default_factory=Counter)

    def to_dict(self) -> dict[str, Any]:
        d = {k: v for k, v in self.__dict__.items()}
        d["skip_reasons"] = dict(self.skip_reasons)
        d["sentences"] = dict(sorted(self.sentences.items()))
        d["seconds"] = round(self.seconds, 3)
        return d

    def merge(self, other: BuildStats) -> None:
        for name, value in other.__dict__.items():
            if name in ("skip_reasons", "sentences"):
                getattr(self, name).update(value)
            elif name == "skipped_examples":
                self.skipped_examples.extend(value[: max(0, 20 - len(self.skipped_examples))])
            else:
                setattr(self, name, getattr(self, name) + value)


class ConstructionFailed(UserError):
    """Too many of a dialogue's windows got no usable LLM reply (an outage, a refused key): no store is kept."""


@dataclass
class Extraction:
    """One dialogue's units, before embedding and consolidation, and the counts of extracting them."""

    dialogue_id: str
    units: list[MemoryUnit]
    stats: BuildStats


def dialogue_extent(dialogue: Dialogue, windows: int) -> dict[str, Any]:
    """How far a store's numbering has got (what :meth:`MemoryBuilder.append` continues from)."""
    return {"sessions": len(dialogue.sessions), "turns": dialogue.num_turns(), "windows": windows,
            "user": _user_name(dialogue) if dialogue.num_turns() else None}


def renumber_sessions(sessions: list[Session], first_session: int, first_turn: int) -> list[Session]:
    """Copies of ``sessions`` numbered as sessions ``first_session``… of a history (the ids
    :func:`~qgmem.serving.history_file.sessions_to_dialogue` gives: ``s3``, turn ``s3:0``), turn indices
    continuing from ``first_turn``."""
    from dataclasses import replace

    out, index = [], first_turn
    for s, session in enumerate(sessions):
        session_id = f"s{first_session + s}"
        turns = []
        for i, turn in enumerate(session.turns):
            turns.append(replace(turn, id=f"{session_id}:{i}", session_id=session_id, index=index))
            index += 1
        out.append(replace(session, id=session_id, turns=turns))
    return out


def _user_name(dialogue: Dialogue) -> str:
    for turn in dialogue.turns():
        if turn.role.lower() != "assistant":
            return turn.speaker
    return "User"


class MemoryBuilder:
    """Builds a :class:`MemoryStore` per dialogue and accumulates :attr:`stats`.

    ``llm`` is required by the LLM extractor and by LLM consolidation; pass a
    :class:`~qgmem.llm.backends.CachedBackend` to make builds replayable and resumable.
    ``max_failed_share``: past this share of a dialogue's windows skipped for want of a usable LLM
    reply (or when all of them are), :meth:`build` raises :class:`ConstructionFailed` instead of
    returning a store that would look finished.
    """

    def __init__(self, config: ConstructionConfig, encoder, llm: LLMBackend | None = None,
                 max_failed_share: float = MAX_FAILED_WINDOW_SHARE):
        if not 0.0 <= max_failed_share <= 1.0:
            raise ValueError(f"max_failed_share must be in [0, 1], got {max_failed_share}")
        self.max_failed_share = max_failed_share
        self.config = config
        self.encoder = encoder
        self.llm = llm
        if config.extractor == "llm" and llm is None:
            raise ValueError("the LLM extractor needs an LLM backend (llm=...)")
        if config.consolidation == "llm" and llm is None:
            raise ValueError("LLM consolidation needs an LLM backend (llm=...)")
        self.heuristic = HeuristicExtractor(config)
        self.parser = ParserExtractor(config) if config.extractor == "parser" else None
        self.llm_extractor = LLMExtractor(llm, config) if llm is not None else None
        self.stats = BuildStats()

    @property
    def uses_llm_consolidation(self) -> bool:
        mode = self.config.consolidation
        return mode == "llm" or (mode == "auto" and self.config.extractor == "llm" and self.llm is not None)

    def expected_meta(self) -> dict[str, Any]:
        """What a store built by this builder records; pass it to :meth:`MemoryStore.load` to check."""
        uses_llm = self.config.extractor == "llm" or self.uses_llm_consolidation
        return {
            "format_version": STORE_FORMAT_VERSION,
            "extractor": self.config.extractor,
            "encoder": getattr(self.encoder, "model_id", type(self.encoder).__name__),
            "llm": self.llm.model_id if uses_llm and self.llm is not None else None,
            "params": self.config.key_dict(),
        }

    def extract(self, dialogue: Dialogue, windows: list[Window] | None = None,
                user_name: str | None = None) -> Extraction:
        """Windows → atomic units (the extractor's part of :meth:`build`), with what it cost.

        The LLM extractor's part touches only the backend, so several dialogues may be extracted at
        once from threads sharing this builder (one server kept busy); :meth:`build` then finishes each
        in order, on one thread. Nothing here writes :attr:`stats`.
        """
        started = time.perf_counter()
        stats = BuildStats(dialogues=1, turns=dialogue.num_turns())
        usage_before = self.llm.usage_here().to_dict() if self.llm is not None else None
        if windows is None:
            windows = make_windows(dialogue, self.config.window_size, self.config.window_overlap)
        stats.windows = len(windows)
        user = user_name or _user_name(dialogue)
        session_times = {s.id: s.time for s in dialogue.sessions}
        units: list[MemoryUnit] = []
        if self.config.extractor == "parser":
            units.extend(self.parser.extract_windows(windows, dialogue.id, user, session_times, stats.sentences))
        elif self.config.extractor == "heuristic":
            for window in windows:
                units.extend(self.heuristic.extract(window, dialogue.id, user, session_times.get(window.session_id),
                                                    stats.sentences))
        else:
            report = self.llm_extractor.extract_windows(windows, dialogue.id, session_times)
            for window, outcome in zip(windows, report.outcomes):
                units.extend(outcome.units)
                stats.retried_windows += outcome.retried
                stats.overlap_only_units += outcome.overlap_only
                if outcome.skipped:
                    stats.skipped_windows += 1
                    stats.unavailable_windows += outcome.unavailable
                    if len(stats.skipped_examples) < 20:
                        stats.skipped_examples.append(f"{dialogue.id}/{window.id}: {outcome.skipped}")
            stats.skip_reasons.update(report.skip_reasons)
        units.sort(key=lambda u: u.order)  # stable: extraction order within a turn is kept
        self._add_llm_usage(stats, usage_before)
        stats.seconds = time.perf_counter() - started
        return Extraction(dialogue.id, units, stats)

    def build(self, dialogue: Dialogue, extraction: Extraction | None = None,
              index_out: list | None = None) -> MemoryStore:
        """The dialogue's store; ``extraction`` is :meth:`extract`'s result when it was run ahead.

        ``index_out``: a list that receives the store's :class:`TraceIndex` (for later appends).
        """
        started = time.perf_counter()
        if extraction is None:
            extraction = self.extract(dialogue)
        elif extraction.dialogue_id != dialogue.id:
            raise ValueError(f"extraction of {extraction.dialogue_id!r} given for dialogue {dialogue.id!r}")
        else:
            started -= extraction.stats.seconds
        stats, units = extraction.stats, extraction.units
        self.check_failures(dialogue.id, stats)
        usage_before = self.llm.usage_here().to_dict() if self.llm is not None else None
        embeddings = self.encoder.encode([u.fact for u in units]) if units else np.zeros(
            (0, int(getattr(self.encoder, "dim", 0))), dtype=np.float32)
        index = TraceIndex.build(units, embeddings, self.encoder.encode, self.config)
        if index_out is not None:
            index_out.append(index)
        trace_report = build_traces(units, embeddings, self.encoder.encode, self.config,
                                    llm=self.llm if self.uses_llm_consolidation else None, index=index)
        stats.units, stats.traces = len(units), len(trace_report.traces)
        stats.updates, stats.supplements = trace_report.updates, trace_report.supplements
        stats.consolidation_fallbacks = trace_report.llm_fallbacks
        self._add_llm_usage(stats, usage_before)
        stats.seconds = time.perf_counter() - started
        meta = self.expected_meta()
        meta.update(dialogue_id=dialogue.id, counts={k: v for k, v in stats.to_dict().items()
                                                     if k not in ("skipped_examples", "seconds")},
                    extent=dialogue_extent(dialogue, stats.windows))
        self.stats.merge(stats)
        return MemoryStore(dialogue_id=dialogue.id, units=units, traces=trace_report.traces,
                           embeddings=embeddings, meta=meta,
                           source_embeddings=source_turn_embeddings(units, self.encoder))

    def check_failures(self, dialogue_id: str, stats: BuildStats) -> None:
        """Raise :class:`ConstructionFailed` when too many windows of one dialogue got no usable reply.

        The counts still join :attr:`stats`, so the build's summary says what failed.
        """
        failed, total = stats.skipped_windows, stats.windows
        if not failed or (failed < total and failed <= self.max_failed_share * total):
            return
        self.stats.merge(stats)
        reasons = ", ".join(f"{k} {v}" for k, v in sorted(stats.skip_reasons.items()))
        first = f"; first: {stats.skipped_examples[0]}" if stats.skipped_examples else ""
        raise ConstructionFailed(
            f"dialogue {dialogue_id!r}: {failed} of {total} windows got no usable LLM reply ({reasons}), more "
            f"than the allowed share {self.max_failed_share:g}{first}; no store was saved for it",
            hint="check the LLM server, model and key, then run again: finished stores are reused and only "
                 "the failed windows are asked again")

    def append(self, store: MemoryStore, sessions: list[Session], index: TraceIndex | None = None,
               ) -> tuple[MemoryStore, TraceIndex]:
        """``store`` with ``sessions`` appended: their units added, traces regrouped, indexes extended.

        The history is not rebuilt: only the new sessions are windowed, extracted and embedded; the
        trace neighbour lists (``index``, rebuilt from the store once when not given) gain the new rows
        and the new units where they enter old rows; then traces are regrouped over the whole store,
        which is cheap (a union over the kept lists). Session ids, turn ids and turn indices, window
        ids and the user's name continue the store's (``meta["extent"]``), so appending a history's
        sessions one at a time gives the store of building the history in one pass. The turns'
        ``session_id``/``id``/``index`` are rewritten to continue the store's numbering; ``store`` itself
        is not changed (readers of it may go on while the new store is built).
        """
        started = time.perf_counter()
        extent = store.meta.get("extent")
        if not isinstance(extent, dict) or not all(k in extent for k in ("sessions", "turns", "windows")):
            raise ValueError(f"store {store.dialogue_id!r} records no 'extent' (built before stores could be "
                             "appended to); rebuild it to append")
        if index is None:
            index = TraceIndex.build(store.units, store.embeddings, self.encoder.encode, self.config)
        elif len(index) != len(store):
            raise ValueError(f"trace index of {len(index)} units given for a store of {len(store)}")
        renumbered = renumber_sessions(sessions, extent["sessions"], extent["turns"])
        dialogue = Dialogue(id=store.dialogue_id, sessions=renumbered)
        windows = make_windows(dialogue, self.config.window_size, self.config.window_overlap)
        for offset, window in enumerate(windows):
            window.id = f"w{extent['windows'] + offset:04d}"
        user = extent.get("user") or _user_name(dialogue)
        extraction = self.extract(dialogue, windows, user)
        stats, new_units = extraction.stats, extraction.units
        self.check_failures(store.dialogue_id, stats)  # an outage appends nothing
        usage_before = self.llm.usage_here().to_dict() if self.llm is not None else None
        new_embeddings = self.encoder.encode([u.fact for u in new_units]) if new_units else np.zeros(
            (0, store.embeddings.shape[1] if store.embeddings.ndim == 2 else int(getattr(self.encoder, "dim", 0))),
            dtype=np.float32)
        units = [copy.copy(u) for u in store.units] + new_units  # regrouping sets trace ids: ``store`` stays as it was
        embeddings = (np.concatenate([np.asarray(store.embeddings, np.float32).reshape(len(store), -1),
                                      new_embeddings]) if len(store) else new_embeddings).astype(np.float32)
        index = index.extend(new_units, embeddings, self.encoder.encode, self.config)
        trace_report = build_traces(units, embeddings, self.encoder.encode, self.config,
                                    llm=self.llm if self.uses_llm_consolidation else None, index=index)
        self._add_llm_usage(stats, usage_before)
        stats.seconds = time.perf_counter() - started
        counts = dict(store.meta.get("counts") or {})
        for name in ("turns", "windows", "skipped_windows", "retried_windows", "overlap_only_units",
                     "llm_requests", "llm_calls", "llm_cache_hits", "prompt_tokens", "completion_tokens"):
            counts[name] = counts.get(name, 0) + getattr(stats, name)
        counts.update(units=len(units), traces=len(trace_report.traces), updates=trace_report.updates,
                      supplements=trace_report.supplements, consolidation_fallbacks=trace_report.llm_fallbacks,
                      dialogues=1)
        stats.units, stats.traces = len(new_units), len(trace_report.traces)
        self.stats.merge(stats)
        meta = {**store.meta, "counts": counts,
                "extent": {"sessions": extent["sessions"] + len(renumbered),
                           "turns": extent["turns"] + dialogue.num_turns(),
                           "windows": extent["windows"] + len(windows), "user": user}}
        source = source_turn_embeddings(new_units, self.encoder)
        if len(store):
            old_source = store.source_embeddings
            if old_source is None or old_source.shape[0] != len(store):  # a store built before it kept them
                old_source = source_turn_embeddings(store.units, self.encoder, stored_source_label(store.meta))
            source = np.concatenate([np.asarray(old_source, np.float32), source])
        return MemoryStore(dialogue_id=store.dialogue_id, units=units, traces=trace_report.traces,
                           embeddings=embeddings, meta=meta, source_embeddings=source), index

    def _add_llm_usage(self, stats: BuildStats, before: dict[str, int] | None) -> None:
        """Add this thread's LLM calls since ``before`` (other threads' calls are theirs to count)."""
        if before is None:
            return
        after = self.llm.usage_here().to_dict()
        stats.llm_requests += after["requests"] - before["requests"]
        stats.llm_calls += after["calls"] - before["calls"]
        stats.llm_cache_hits += after["cache_hits"] - before["cache_hits"]
        stats.prompt_tokens += after["prompt_tokens"] - before["prompt_tokens"]
        stats.completion_tokens += after["completion_tokens"] - before["completion_tokens"]
