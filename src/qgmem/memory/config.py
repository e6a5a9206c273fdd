"""Settings of offline memory construction; defaults are the paper's (appendix, construction)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any

from qgmem import older_records

EXTRACTORS = ("parser", "heuristic", "llm")
#: the largest share of one dialogue's windows whose LLM extraction may fail (no reply, or none that
#: validated) before construction stops instead of saving the store; a dialogue whose windows all failed
#: is never a finished store. Not a ``ConstructionConfig`` field: it decides whether to keep a store,
#: not what the store holds, so it is no part of a store's or a cache's parameters.
MAX_FAILED_WINDOW_SHARE = 0.5
CONSOLIDATIONS = ("auto", "rule", "llm")


@dataclass
class ConstructionConfig:
    """How dialogues become atomic units and traces.

    Windows: sessions are split into sliding windows of ``window_size`` turns; consecutive windows share
    ``window_overlap`` turns (step = size - overlap = 4). Overlap turns are context only: a unit must be
    grounded in at least one of its window's new turns.

    Extraction: ``extractor`` is ``"parser"`` (the embedded default: the heuristic rules choose the claims,
    spaCy's dependency parse and NER read their triples, relations and attributes), ``"heuristic"``
    (rules only, the earlier default, kept for comparison) or ``"llm"`` (the paper's prompted
    construction; needs a backend). ``max_new_tokens`` bounds one construction reply;
    ``llm_retries`` is how many times an invalid reply is asked again with the validation error before
    the window is skipped. ``min_words`` drops sentences too short to carry a claim (heuristic).

    Traces: every unit looks at its ``neighbours`` nearest units by fact embedding; a pair links when the
    embeddings of their subject–relation keys have cosine ≥ ``trace_threshold`` and their facts cosine
    ≥ ``min_fact_similarity`` (the second guard keeps "I use green for hot leads" and "I use a French
    press" apart even though both are "user uses"). Connected groups of at least ``min_trace_size``
    units become traces. ``consolidation`` decides update vs supplement: ``"rule"``, ``"llm"`` (one
    prompt per trace), or ``"auto"`` (LLM when the extractor is the LLM one, rule otherwise).
    """

    window_size: int = 6
    window_overlap: int = 2
    extractor: str = "parser"
    neighbours: int = 20
    trace_threshold: float = 0.80
    min_fact_similarity: float = 0.35
    min_trace_size: int = 2
    consolidation: str = "auto"
    max_new_tokens: int = 768
    llm_retries: int = 1
    min_words: int = 4
    temperature: float = 0.0

    def __post_init__(self) -> None:
        if self.window_size < 1:
            raise ValueError(f"window_size must be >= 1, got {self.window_size}")
        if not 0 <= self.window_overlap < self.window_size:
            raise ValueError(f"window_overlap must be in [0, window_size), got {self.window_overlap} "
                             f"with window_size {self.window_size}")
        if self.extractor not in EXTRACTORS:
            raise ValueError(f"extractor must be one of {EXTRACTORS}, got {self.extractor!r}")
        if self.consolidation not in CONSOLIDATIONS:
            raise ValueError(f"consolidation must be one of {CONSOLIDATIONS}, got {self.consolidation!r}")
        if not 0.0 <= self.trace_threshold <= 1.0 or not -1.0 <= self.min_fact_similarity <= 1.0:
            raise ValueError("trace_threshold must be in [0, 1] and min_fact_similarity in [-1, 1]")
        if self.neighbours < 1 or self.min_trace_size < 2:
            raise ValueError("neighbours must be >= 1 and min_trace_size >= 2")

    @property
    def window_step(self) -> int:
        return self.window_size - self.window_overlap

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def key_dict(self) -> dict[str, Any]:
        """The settings as stores and caches are keyed by them, with the retired fields that keys held at
        today's values (``qgmem.older_records``), so stores and caches built before still match."""
        return older_records.construction_key(asdict(self))

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ConstructionConfig:
        """Settings as a store, cache or export recorded them; retired fields are read by
        ``qgmem.older_records`` (a value this version cannot reproduce is refused by name)."""
        d = older_records.read_construction(d)
        known = {f.name for f in fields(cls)}
        unknown = set(d) - known
        if unknown:
            raise ValueError(f"unknown construction settings: {sorted(unknown)}")
        return cls(**d)
