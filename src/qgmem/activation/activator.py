"""Query-aware working-memory activation over one dialogue's store (paper §III-B).

question -> constraints (parser) -> lexical / semantic / attribute / source channels -> reciprocal-rank
fusion into a pool of n -> the latest state of superseded trace members joins the pool -> reranker ->
turn diversity -> top k -> local graph + textual working memory.

Build one ``Activator`` per store and reuse it for all the store's questions: the indexes are built
once, and a shared model reranker can be passed in so it is loaded once for many stores.
"""

from __future__ import annotations

import logging
import re
import time

import numpy as np

from qgmem.activation.channels import AttributeChannel, Hits, LexicalChannel, SemanticChannel
from qgmem.activation.config import ActivationConfig
from qgmem.activation.fuse import reciprocal_rank_fusion
from qgmem.activation.graph import build_local_graph
from qgmem.activation.query import QueryConstraints, QueryParser, make_parser
from qgmem.activation.records import WorkingMemory
from qgmem.activation.rerank import Candidate, EmbeddingReranker, Reranker, candidate_document, make_reranker
from qgmem.activation.serialize import serialize_working_memory
from qgmem.memory.source_turns import source_turn_embeddings
from qgmem.memory.store import MemoryStore
from qgmem.older_records import stored_source_label

log = logging.getLogger(__name__)

#: a store without source-turn vectors at least this large is worth a warning (embedding it takes seconds)
SOURCE_WARN_UNITS = 1000


def superseded_map(store: MemoryStore) -> dict[str, str]:
    """Unit id -> its trace's latest unit id, for members overtaken by a later ``update``.

    A member followed only by ``supplement`` transitions still holds (compatible additions coexist),
    so only an update supersedes.
    """
    out: dict[str, str] = {}
    for trace in store.traces:
        for i, uid in enumerate(trace.unit_ids):
            if uid != trace.latest_unit_id and "update" in trace.transitions[i + 1:]:
                out[uid] = trace.latest_unit_id
    return out


def speaker_name_pattern(units) -> re.Pattern | None:
    """A whole-word pattern of the units' speakers' names (with a possessive ``'s``), longest first."""
    names = sorted({u.speaker.strip() for u in units if len(u.speaker.strip()) >= 2}, key=len, reverse=True)
    if not names:
        return None
    return re.compile(r"\b(?:" + "|".join(map(re.escape, names)) + r")(?:['’]s)?\b")


def without_speaker_names(question: str, pattern: re.Pattern | None) -> str:
    """``question`` with the names ``pattern`` matches removed (spaces collapsed); unchanged when nothing
    is left of it."""
    if pattern is None:
        return question
    neutral = " ".join(pattern.sub(" ", question).split())
    return neutral if re.search(r"\w", neutral) else question


def diversify_turns(ranked: list[tuple[Candidate, float]], per_turn: int) -> list[tuple[Candidate, float]]:
    """``ranked`` with every unit whose source turns each already have ``per_turn`` units above it moved
    below the rest (both groups keep their order; the moved ones are scored below the lowest kept score).

    Several facts of one turn fill several of the k slots with one piece of the dialogue; moving the
    repeats down lets the next-best turns in. A unit without source turns is never moved.
    """
    counts: dict[str, int] = {}
    kept: list[tuple[Candidate, float]] = []
    moved: list[Candidate] = []
    for candidate, score in ranked:
        turns = candidate.unit.source_turn_ids
        if turns and all(counts.get(t, 0) >= per_turn for t in turns):
            moved.append(candidate)
            continue
        for t in turns:
            counts[t] = counts.get(t, 0) + 1
        kept.append((candidate, score))
    if not moved:
        return ranked
    floor = (kept[-1][1] if kept else 0.0) - 1.0
    return kept + [(c, floor - i * 1e-3) for i, c in enumerate(moved)]


class Activator:
    """Hybrid retrieval, fusion, reranking and working-memory assembly for one ``MemoryStore``."""

    def __init__(self, store: MemoryStore, encoder, config: ActivationConfig | None = None,
                 reranker: Reranker | None = None, parser: QueryParser | None = None, llm=None,
                 semantic: SemanticChannel | None = None, source: SemanticChannel | None = None):
        self.store = store
        self.encoder = encoder
        self.config = config = config or ActivationConfig()
        units = store.units
        embeddings = np.asarray(store.embeddings, dtype=np.float32)
        if units and (embeddings.ndim != 2 or embeddings.shape[0] != len(units)):
            raise ValueError(
                f"store {store.dialogue_id!r}: field 'embeddings' has shape {embeddings.shape}, "
                f"expected [{len(units)}, dim] aligned with its units"
            )
        if units and embeddings.shape[1] != encoder.dim:
            raise ValueError(
                f"store {store.dialogue_id!r}: embeddings have dim {embeddings.shape[1]} but the encoder "
                f"{getattr(encoder, 'model_id', '?')!r} gives {encoder.dim}; rebuild the store with this encoder"
            )
        self.embeddings = embeddings
        channels = config.channels
        self.lexical = (LexicalChannel.for_units(units, k1=config.bm25_k1, b=config.bm25_b)
                        if "lexical" in channels else None)
        if semantic is not None and "semantic" in channels:  # given by extended(): already holds these rows
            self.semantic = semantic
        else:
            self.semantic = (SemanticChannel(embeddings, config.ann_min_units, config.hnsw_m, config.hnsw_ef_search)
                             if "semantic" in channels else None)
        self.attribute = (AttributeChannel(units, encoder, config.attribute_threshold)
                          if "attribute" in channels else None)
        # the units' source turns: the store's own vectors (built with it), else embedded now
        self.source_embeddings = self._source_embeddings(store, encoder) if config.uses_source_turns else None
        if source is not None and "source" in channels:  # given by extended(), like ``semantic``
            self.source = source
        else:
            self.source = (SemanticChannel(self.source_embeddings, config.ann_min_units, config.hnsw_m,
                                           config.hnsw_ef_search)
                           if "source" in channels else None)
        blend = dict(weight=config.embedding_weight, lexical_weight=config.lexical_weight,
                     source_embeddings=self.source_embeddings, source_weight=config.source_weight)
        self.reranker = reranker if reranker is not None else make_reranker(
            config.reranker, embeddings=embeddings, encoder=encoder, path=config.reranker_path,
            batch_size=config.reranker_batch_size, max_doc_tokens=config.reranker_max_doc_tokens, **blend,
        )
        # two-stage reranking: the embedding reranker orders the pool, the model rescores its top
        # (``rerank_depth``) and its score may count beside the model's (``model_weight`` < 1)
        self.first_stage = (EmbeddingReranker(embeddings, encoder, **blend)
                            if config.reranker != "embedding" and (config.rerank_depth or config.model_weight < 1)
                            else None)
        self.parser = parser if parser is not None else make_parser(config.parser, llm)
        self.superseded = superseded_map(store)
        self.last_timings: dict[str, float] = {}  # milliseconds per stage of the latest activate()
        self.last_hits: dict[str, Hits] = {}  # the latest activate()'s channel lists ...
        self.last_pool: list[Candidate] = []  # ... its fused pool ...
        self.last_ranking: list[tuple[Candidate, float]] = []  # ... and the whole pool in reranked order
        self.last_query_vec: np.ndarray | None = None
        self.last_question_vec: np.ndarray | None = None
        self.speaker_names = speaker_name_pattern(units) if config.dense_speaker_names != "keep" else None

    @staticmethod
    def _source_embeddings(store: MemoryStore, encoder) -> np.ndarray:
        stored = store.source_embeddings
        if stored is not None and stored.shape == (len(store), encoder.dim):
            return np.asarray(stored, dtype=np.float32)
        if len(store) >= SOURCE_WARN_UNITS:
            log.warning("store %r holds no source-turn vectors (built before stores kept them): embedding its "
                        "%d units' turns now, at every start; rebuild it, or save it after an append, to keep them",
                        store.dialogue_id, len(store))
        # a store built before it kept them, embedded as its construction settings say
        return source_turn_embeddings(store.units, encoder, stored_source_label(store.meta))

    def extended(self, store: MemoryStore, reranker: Reranker | None = None) -> Activator:
        """An activator over ``store``, this one's store with units appended (``MemoryBuilder.append``).

        The dense indexes (facts and source turns) get the new rows in place instead of being rebuilt
        (at 100k units an HNSW build takes minutes on a CPU); BM25, whose statistics change with every
        document, and the attribute index (its name vectors come from the encoder's memo) are rebuilt.
        This activator must not be used afterwards: its dense indexes now hold the new rows too.
        """
        semantic = source = None
        if self.semantic is not None and len(store) >= len(self.store):
            semantic = self.semantic.extend(store.embeddings, self.config.ann_min_units)
        if self.source is not None and len(store) >= len(self.store):
            source = self.source.extend(self._source_embeddings(store, self.encoder), self.config.ann_min_units)
        return Activator(store, self.encoder, self.config, reranker=reranker, parser=self.parser, semantic=semantic,
                         source=source)

    # -- stages (public so benchmarks and diagnostics can time and inspect them) -----------------------
    def parse(self, question: str, question_time: str | None = None) -> QueryConstraints:
        return self.parser.parse(question, question_time)

    def encode_query(self, question: str, constraints: QueryConstraints) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Question, entity and location embeddings from a single encoder call.

        With ``dense_speaker_names`` ``drop`` the question vector is the question's without the store's
        speaker names (a question naming no speaker is encoded as it is).
        """
        neutral = without_speaker_names(question, self.speaker_names)
        dropped = neutral != question
        vecs = self.encoder.encode([neutral, *constraints.entities, *constraints.locations])
        query_vec, rest = vecs[0], vecs[1:]
        # the question as written, when it was encoded (the dense turn baseline reuses it)
        self.last_question_vec = None if dropped else vecs[0]
        n_ent = len(constraints.entities)
        return query_vec, rest[:n_ent], rest[n_ent:]

    def channel_hits(self, question: str, constraints: QueryConstraints, query_vec: np.ndarray,
                     entity_vecs: np.ndarray | None = None, location_vecs: np.ndarray | None = None) -> dict[str, Hits]:
        depth = self.config.channel_depth
        hits: dict[str, Hits] = {}
        timings = self.last_timings
        if self.lexical is not None:
            t = time.perf_counter()
            hits["lexical"] = self.lexical.search(question, depth)
            timings["lexical"] = (time.perf_counter() - t) * 1e3
        if self.semantic is not None:
            t = time.perf_counter()
            hits["semantic"] = self.semantic.search(query_vec, depth)
            timings["semantic"] = (time.perf_counter() - t) * 1e3
        if self.attribute is not None:
            t = time.perf_counter()
            hits["attribute"] = self.attribute.search(constraints, depth, entity_vecs, location_vecs)
            timings["attribute"] = (time.perf_counter() - t) * 1e3
        if self.source is not None:
            t = time.perf_counter()
            hits["source"] = self.source.search(query_vec, depth)
            timings["source"] = (time.perf_counter() - t) * 1e3
        return hits

    def pool(self, hits: dict[str, Hits]) -> list[Candidate]:
        """Fuse the channels, then bring in the latest state of superseded trace members.

        A superseded member stays and its trace's latest unit joins the pool right after it (same fused
        score), so the current state can always be chosen; the latest unit records the members it stands
        for (``via``).
        """
        rankings = {name: [i for i, _ in h] for name, h in hits.items()}
        fused = reciprocal_rank_fusion(rankings, rrf_k=self.config.rrf_k, pool_size=self.config.pool_size)
        # BM25 evidence as a score, not only a rank: rank fusion keeps the order of the lexical list
        # but forgets whether its top hit matched a rare name or one common word.
        lexical = dict(hits.get("lexical", []))
        top_lexical = max(lexical.values(), default=0.0)
        units = self.store.units
        pool: list[Candidate] = []
        by_index: dict[int, Candidate] = {}

        def add(index: int, score: float, ranks: dict[str, int], via: int) -> None:
            candidate = by_index.get(index)
            if candidate is None:
                candidate = Candidate(index=index, unit=units[index], fused=score, ranks=dict(ranks),
                                      lexical=lexical.get(index, 0.0) / top_lexical if top_lexical > 0 else 0.0)
                by_index[index] = candidate
                pool.append(candidate)
            if via not in candidate.via:
                candidate.via.append(via)

        for item in fused:
            latest = self.superseded.get(units[item.index].id)
            latest_index = self.store.index_of(latest) if latest is not None else None
            add(item.index, item.score, item.ranks, item.index)
            if latest_index is not None:
                add(latest_index, item.score, {}, item.index)
        return pool

    def document(self, candidate: Candidate) -> str:
        unit = candidate.unit
        return candidate_document(unit, self.store.trace_of(unit), self.store.unit)

    def rank(self, question: str, pool: list[Candidate], query_vec: np.ndarray) -> list[tuple[Candidate, float]]:
        """The whole pool by reranker score, best first (ties: fused order).

        With ``rerank_depth`` m and a model reranker, the embedding reranker orders the pool first and
        the model scores only its top m; the rest follow in embedding order, scored below the model's
        lowest score so the list stays sorted. With ``model_weight`` α < 1 a scored unit's score is
        ``(1 − α) · embedding score + α · model score``.
        """
        if not pool:
            return []
        rest: list[Candidate] = []
        first_scores = None
        alpha = self.config.model_weight
        depth = self.config.rerank_depth
        if self.first_stage is not None and (len(pool) > depth > 0 or alpha < 1.0):
            first = self._ordered(pool, self.first_stage.score(question, pool, query_vec))
            depth = depth or len(first)
            pool, rest = [c for c, _ in first[:depth]], [c for c, _ in first[depth:]]
            first_scores = np.asarray([s for _, s in first[:depth]], dtype=np.float32)
        for c in pool:
            if not c.document:
                c.document = self.document(c)
        scores = np.asarray(self.reranker.score(question, pool, query_vec), dtype=np.float32)
        if first_scores is not None and alpha < 1.0 and scores.shape == first_scores.shape:
            scores = (1.0 - alpha) * first_scores + alpha * scores
        ranked = self._ordered(pool, scores)
        if rest:
            floor = ranked[-1][1] - 1.0
            ranked += [(c, floor - i * 1e-3) for i, c in enumerate(rest)]
        if self.config.max_units_per_turn:
            ranked = diversify_turns(ranked, self.config.max_units_per_turn)
        return ranked

    @staticmethod
    def _ordered(pool: list[Candidate], scores) -> list[tuple[Candidate, float]]:
        scores = np.asarray(scores, dtype=np.float32)
        if scores.shape != (len(pool),):
            raise ValueError(f"reranker returned {scores.shape} scores for {len(pool)} candidates")
        order = np.lexsort((np.arange(len(pool)), -scores))
        return [(pool[i], float(scores[i])) for i in order]

    def rerank(self, question: str, pool: list[Candidate], query_vec: np.ndarray) -> list[tuple[Candidate, float]]:
        """Top ``k`` of the pool by reranker score (ties: fused order)."""
        return self.rank(question, pool, query_vec)[: self.config.k]

    # -- the whole path ----------------------------------------------------------------------------------
    def activate(self, question: str, question_time: str | None = None) -> WorkingMemory:
        """The working memory for ``question``: top-k units in reranked order, traces, local graph, text."""
        self.last_timings = {}
        t0 = time.perf_counter()
        constraints = self.parse(question, question_time)
        query_vec, entity_vecs, location_vecs = self.encode_query(question, constraints)
        self.last_query_vec = query_vec
        t1 = time.perf_counter()
        self.last_timings["parse_encode"] = (t1 - t0) * 1e3
        hits = self.channel_hits(question, constraints, query_vec, entity_vecs, location_vecs)
        t2 = time.perf_counter()
        pool = self.pool(hits)
        ranking = self.rank(question, pool, query_vec)
        config = self.config
        # kept for diagnostics (eval-retrieval's pool recall and deeper recall@k); references, no copies
        self.last_hits, self.last_pool, self.last_ranking = hits, pool, ranking
        chosen = ranking[: config.k]
        t3 = time.perf_counter()
        self.last_timings["fuse_rerank"] = (t3 - t2) * 1e3
        units = [c.unit for c, _ in chosen]
        traces = {}
        for unit in units:
            trace = self.store.trace_of(unit)
            if trace is not None:
                traces[trace.id] = trace
        wm = WorkingMemory(
            question=question,
            units=units,
            scores=[s for _, s in chosen],
            traces=traces,
            graph=build_local_graph(units),
            text=serialize_working_memory(units, self.store),
            constraints=constraints,
        )
        self.last_timings["assemble"] = (time.perf_counter() - t3) * 1e3
        self.last_timings["total"] = (time.perf_counter() - t0) * 1e3
        return wm
