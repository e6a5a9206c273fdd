"""The three retrieval channels over one store: lexical (BM25), semantic (FAISS), event attributes.

Each channel is built once per store and answers ``search(...) -> list[(unit index, score)]``, best
first. Building is cheap (milliseconds for a few hundred units) because the training pipeline builds
one activator per dialogue.
"""

from __future__ import annotations

import re
from collections import defaultdict
from dataclasses import dataclass

import numpy as np

from qgmem.activation.query import QueryConstraints
from qgmem.timeexpr import parse_fact_time, parse_iso_date
from qgmem.memory.records import MemoryUnit

Hits = list[tuple[int, float]]


def _stemmer():
    import snowballstemmer

    return snowballstemmer.stemmer("english")


def _top(scores: np.ndarray, n: int, keep: np.ndarray | None = None) -> Hits:
    """Indices of the ``n`` largest scores (only where ``keep``), best first, ties by index."""
    if keep is None:
        keep = scores > 0
    candidates = np.flatnonzero(keep)
    if candidates.size == 0:
        return []
    if candidates.size > n:
        part = np.argpartition(-scores[candidates], n - 1)[:n]
        candidates = candidates[part]
    order = np.lexsort((candidates, -scores[candidates]))
    chosen = candidates[order]
    return [(int(i), float(scores[i])) for i in chosen]


class LexicalChannel:
    """BM25 over each unit's fact text plus its source text (bm25s, English stop words, Snowball stems)."""

    def __init__(self, texts: list[str], k1: float = 1.5, b: float = 0.75):
        import bm25s

        self._bm25s = bm25s
        self._stemmer = _stemmer()
        self.size = len(texts)
        self.retriever = None
        if texts:
            tokens = bm25s.tokenize(texts, stopwords="en", stemmer=self._stemmer, return_ids=False,
                                    show_progress=False)
            if any(tokens):
                self.retriever = bm25s.BM25(k1=k1, b=b)
                self.retriever.index(tokens, show_progress=False)

    @classmethod
    def for_units(cls, units: list[MemoryUnit], **kwargs) -> LexicalChannel:
        """BM25 over ``fact + source text``."""
        return cls([f"{u.fact}\n{u.source_text}" for u in units], **kwargs)

    def query_tokens(self, question: str) -> list[str]:
        tokens = self._bm25s.tokenize([question], stopwords="en", stemmer=self._stemmer, return_ids=False,
                                      show_progress=False)[0]
        vocab = self.retriever.vocab_dict if self.retriever is not None else {}
        return [t for t in tokens if t in vocab]

    def search(self, question: str, n: int) -> Hits:
        if self.retriever is None:
            return []
        tokens = self.query_tokens(question)
        if not tokens:
            return []
        scores = np.asarray(self.retriever.get_scores(tokens), dtype=np.float32)
        return _top(scores, n)


class SemanticChannel:
    """Inner product over normalized embeddings: exact flat index, HNSW at ``ann_min_units`` and above."""

    def __init__(self, embeddings: np.ndarray, ann_min_units: int = 50_000, hnsw_m: int = 32,
                 ef_search: int = 128, ef_construction: int = 80):
        import faiss

        emb = np.ascontiguousarray(embeddings, dtype=np.float32)
        self.size = int(emb.shape[0]) if emb.ndim == 2 else 0
        self.dim = int(emb.shape[1]) if emb.ndim == 2 and emb.shape[1] else 0
        self.approximate = self.size >= ann_min_units
        self.index = None
        if self.size and self.dim:
            if self.approximate:
                index = faiss.IndexHNSWFlat(self.dim, hnsw_m, faiss.METRIC_INNER_PRODUCT)
                index.hnsw.efConstruction = ef_construction
                index.hnsw.efSearch = max(ef_search, 1)
            else:
                index = faiss.IndexFlatIP(self.dim)
            index.add(emb)
            self.index = index

    def extend(self, embeddings: np.ndarray, ann_min_units: int = 50_000) -> SemanticChannel:
        """This channel with ``embeddings`` (all rows, the indexed ones first) added: the new rows go into
        the index in place (an HNSW graph is not rebuilt); a flat index that reaches ``ann_min_units``
        is rebuilt as HNSW. The channel is changed: its old owner must not search it afterwards."""
        emb = np.ascontiguousarray(embeddings, dtype=np.float32)
        if self.index is None or (not self.approximate and emb.shape[0] >= ann_min_units):
            return SemanticChannel(emb, ann_min_units)
        if emb.shape[0] > self.size:
            self.index.add(emb[self.size:])
            self.size = int(emb.shape[0])
        return self

    def search(self, query_vec: np.ndarray, n: int) -> Hits:
        if self.index is None or n <= 0:
            return []
        q = np.ascontiguousarray(query_vec, dtype=np.float32).reshape(1, -1)
        if self.approximate:
            self.index.hnsw.efSearch = max(self.index.hnsw.efSearch, n)
        scores, ids = self.index.search(q, min(n, self.size))
        return [(int(i), float(s)) for i, s in zip(ids[0], scores[0]) if i >= 0]


def normalize_name(text: str) -> str:
    """Case-, space- and punctuation-insensitive key for names, node labels and attributes."""
    return re.sub(r"\s+", " ", re.sub(r"[^\w\s&'-]", " ", text.lower())).strip()


@dataclass
class _NameIndex:
    names: list[str]
    units: list[np.ndarray]  # unit indices per name
    vectors: np.ndarray | None = None  # lazily encoded, normalized


def _name_index(values_per_unit: list[list[str]]) -> _NameIndex:
    owners: dict[str, list[int]] = defaultdict(list)
    surface: dict[str, str] = {}
    for i, values in enumerate(values_per_unit):
        for v in values:
            key = normalize_name(v)
            if key:
                surface.setdefault(key, v.strip())
                if not owners[key] or owners[key][-1] != i:
                    owners[key].append(i)
    keys = list(owners)
    return _NameIndex([surface[k] for k in keys], [np.asarray(owners[k], dtype=np.int64) for k in keys])


class AttributeChannel:
    """Event-attribute match: entities and locations by dense similarity, fact time by interval overlap.

    Each distinct entity and location of the store is embedded once, when the channel is built (index
    time, not query time; ``lazy=True`` defers it to the first query that needs it). A unit's score is
    the sum, over the question's constraints it satisfies, of the best similarity of a matching name
    (≥ ``threshold``), plus 1 for a fact time overlapping the asked interval; units satisfying nothing
    are not returned.
    """

    def __init__(self, units: list[MemoryUnit], encoder, threshold: float = 0.60, lazy: bool = False):
        self.encoder = encoder
        self.threshold = threshold
        self.size = len(units)
        self.entities = _name_index([u.entities for u in units])
        self.locations = _name_index([[u.location] if u.location else [] for u in units])
        starts = np.full(self.size, np.iinfo(np.int64).max, dtype=np.int64)
        ends = np.full(self.size, np.iinfo(np.int64).min, dtype=np.int64)
        for i, u in enumerate(units):
            span = parse_fact_time(u.fact_time)
            if span is not None:
                starts[i], ends[i] = span[0].toordinal(), span[1].toordinal()
        self.fact_start, self.fact_end = starts, ends
        if not lazy:
            self._vectors(self.entities)
            self._vectors(self.locations)

    def _vectors(self, index: _NameIndex) -> np.ndarray:
        if index.vectors is None:
            index.vectors = self.encoder.encode(index.names) if index.names else np.zeros((0, 1), np.float32)
        return index.vectors

    def _match(self, index: _NameIndex, query_vecs: np.ndarray, scores: np.ndarray) -> None:
        if not index.names or query_vecs.shape[0] == 0:
            return
        sims = query_vecs @ self._vectors(index).T  # [q, names]
        for row in sims:
            best = np.zeros(self.size, dtype=np.float32)
            for j in np.flatnonzero(row >= self.threshold):
                owners = index.units[j]
                best[owners] = np.maximum(best[owners], row[j])
            scores += best

    def search(self, constraints: QueryConstraints, n: int, entity_vecs: np.ndarray | None = None,
               location_vecs: np.ndarray | None = None) -> Hits:
        """Rank units by satisfied constraints; ``*_vecs`` are the constraints' embeddings if already computed."""
        if self.size == 0 or constraints.is_empty():
            return []
        scores = np.zeros(self.size, dtype=np.float32)
        if constraints.entities:
            vecs = entity_vecs if entity_vecs is not None else self.encoder.encode(constraints.entities)
            self._match(self.entities, vecs, scores)
        if constraints.locations:
            vecs = location_vecs if location_vecs is not None else self.encoder.encode(constraints.locations)
            self._match(self.locations, vecs, scores)
        if constraints.has_time:
            start, end = parse_iso_date(constraints.time_start), parse_iso_date(constraints.time_end)
            if start and end:
                overlap = (self.fact_start <= end.toordinal()) & (self.fact_end >= start.toordinal())
                scores += overlap.astype(np.float32)
        return _top(scores, n)
