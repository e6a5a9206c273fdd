"""Settings of query-time activation (paper §III-B and appendix A-2; defaults are the paper's)."""

from __future__ import annotations

import copy
from dataclasses import asdict, dataclass
from typing import Any, Literal

from qgmem import older_records

RerankerKind = Literal["embedding", "cross-encoder", "llm", "trained"]
RERANKERS = ("embedding", "cross-encoder", "llm", "trained")
ParserKind = Literal["heuristic", "llm"]
SpeakerNamesMode = Literal["keep", "drop"]
SPEAKER_NAME_MODES = ("keep", "drop")


#: fields added after caches were first keyed by these settings, each with the value that reproduces
#: activation as it was before the field existed (see ``ActivationConfig.key_dict``)
LATER_FIELDS: dict[str, object] = {
    "rerank_depth": 0, "source_weight": 0.0, "max_units_per_turn": 0, "dense_speaker_names": "keep",
    "model_weight": 1.0,
}
#: the retrieval channels; ``source`` is dense retrieval over each unit's source turn (docs/activation.md)
CHANNELS = ("lexical", "semantic", "attribute", "source")


@dataclass
class ActivationConfig:
    """Everything that changes which units become working memory.

    ``k`` and ``pool_size`` are the paper's K = 10 and n = 100; ``rrf_k`` is the reciprocal-rank-fusion
    constant; ``attribute_threshold`` the dense-similarity bar for entity/location matches (0.60).
    Stores with at least ``ann_min_units`` units get an approximate (HNSW) FAISS index instead of an exact
    flat one, because exact search grows linearly with the store.
    """

    k: int = 10
    pool_size: int = 100
    channel_depth: int = 100  # candidates each channel contributes before fusion
    rrf_k: float = 60.0
    attribute_threshold: float = 0.60
    channels: tuple[str, ...] = CHANNELS  # the paper's three and ``source`` (docs/activation.md)
    ann_min_units: int = 50_000
    hnsw_m: int = 32
    hnsw_ef_search: int = 128
    bm25_k1: float = 1.5
    bm25_b: float = 0.75
    reranker: RerankerKind = "embedding"
    reranker_path: str | None = None  # cross-encoder folder, or causal LM (path/hub id/embedded alias)
    # model rerankers (cross-encoder, trained, llm) score only the top ``rerank_depth`` units of the
    # embedding reranker's order (0 = the whole pool); the rest keep that order below them
    rerank_depth: int = 0
    # a model reranker's share of the score: ``(1 - model_weight) * first-stage score + model_weight *
    # model score`` (1: the model's score alone; below 1 the embedding reranker's score still counts)
    model_weight: float = 1.0
    reranker_batch_size: int = 16
    reranker_max_doc_tokens: int = 256
    embedding_weight: float = 0.3  # embedding reranker: weight of cosine vs. the fused channel score
    lexical_weight: float = 0.2  # embedding reranker: added weight of the normalized BM25 score
    # embedding reranker: added weight of the cosine between the question and the unit's source turn
    source_weight: float = 1.0
    parser: ParserKind = "heuristic"
    # what the dense query (fact and source channels, the embedding reranker's cosines) does with the
    # names of the store's speakers in the question: "keep" them (the paper's activation) or "drop" them.
    # A name pulls dense retrieval to that speaker's units, which is wrong when the question asks one
    # speaker about what the other said (LoCoMo's adversarial questions; docs/activation.md)
    dense_speaker_names: SpeakerNamesMode = "drop"
    # turn diversity: after reranking, a unit whose source turns each already have this many units
    # ranked above it moves below the others (0 = off), so the k slots cover more of the dialogue
    max_units_per_turn: int = 1

    def __post_init__(self) -> None:
        if self.k < 1 or self.pool_size < self.k:
            raise ValueError(f"need 1 <= k <= pool_size, got k={self.k}, pool_size={self.pool_size}")
        if self.reranker not in RERANKERS:
            raise ValueError(f"reranker must be one of {'|'.join(RERANKERS)}, got {self.reranker!r}")
        if self.dense_speaker_names not in SPEAKER_NAME_MODES:
            raise ValueError(f"dense_speaker_names must be {'|'.join(SPEAKER_NAME_MODES)}, "
                             f"got {self.dense_speaker_names!r}")
        if self.parser not in ("heuristic", "llm"):
            raise ValueError(f"parser must be heuristic|llm, got {self.parser!r}")
        unknown = set(self.channels) - set(CHANNELS)
        if unknown or not self.channels:
            raise ValueError(f"channels must be a non-empty subset of {'/'.join(CHANNELS)}, got {self.channels}")
        for name in ("embedding_weight", "model_weight"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"{name} must lie in [0, 1], got {getattr(self, name)}")
        for name in ("lexical_weight", "source_weight"):
            if getattr(self, name) < 0.0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        for name in ("rerank_depth", "max_units_per_turn"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        self.channels = tuple(self.channels)

    @property
    def uses_source_turns(self) -> bool:
        """Whether activation needs the units' source-turn embeddings (source channel or reranker term)."""
        return "source" in self.channels or self.source_weight > 0

    def key_dict(self) -> dict[str, Any]:
        """The settings as a cache key holds them: every field, except that a field added after caches
        were first keyed is left out while it has the value that reproduces the activation before it
        existed, so adding a setting does not invalidate every existing cache (and the old settings still
        find their caches); retired settings that every key held keep their place at today's value
        (``qgmem.older_records``); a model reranker adds its weights' digest, so a retrained reranker
        in the same folder rebuilds the cache."""
        from qgmem.activation.rerank import reranker_fingerprint

        d = asdict(self)
        for name, before in LATER_FIELDS.items():
            if d[name] == before:
                del d[name]
        d = older_records.activation_key(d)
        weights = reranker_fingerprint(self.reranker, self.reranker_path)
        if weights is not None:
            d["reranker_weights"] = weights
        return d

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> ActivationConfig:
        """Settings as an export or a cache recorded them. A later field the record does not hold takes
        the value that reproduces activation before the field existed, not today's default: an export
        written then keeps activating as it was trained. Retired settings are read by
        ``qgmem.older_records``: at the value today's activation uses they are dropped, at another
        they are refused by name."""
        values = older_records.read_activation(values)
        for name, before in LATER_FIELDS.items():
            values.setdefault(name, copy.copy(before))
        if isinstance(values.get("channels"), list):
            values["channels"] = tuple(values["channels"])
        return cls(**values)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["channels"] = list(self.channels)
        return d
