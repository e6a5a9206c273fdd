"""Map gold evidence onto turn ids, and count how each mapping was made.

Two kinds of evidence reach us:

* **text spans** (ConvoMem ``message_evidences``): upstream spans equal a message only ~72 % of the
  time; others add or drop a lead-in or paraphrase a word. We try, in order, an exact match, a
  containment match after light normalisation (case, whitespace, typographic quotes/dashes), and a
  rapidfuzz similarity above a threshold. Anything weaker is *unmatched* and reported, never guessed.
* **turn ids** (LoCoMo ``evidence``: ``"D1:3"``): some ids in the wild are malformed
  (``"D1:3; D2:5"``, ``"D:1:3"``, ``"d1: 3"``). Unambiguous ones are normalised; the rest are reported.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from rapidfuzz import fuzz

from qgmem.data.records import Turn

#: rapidfuzz similarity (0-100) a span needs to map to a turn when it is neither equal nor contained
DEFAULT_FUZZY_THRESHOLD = 80.0
_MAX_EXAMPLES = 20
_MIN_CONTAINED_CHARS = 12
_MIN_PARTIAL_CHARS = 40  # shorter spans ("Green") are too likely to occur inside unrelated turns

_TYPOGRAPHY = str.maketrans({"\u2019": "'", "\u2018": "'", "\u201c": '"', "\u201d": '"', "\u2013": "-",
                             "\u2014": "-", "\u00a0": " ", "\u2026": "..."})
_SPACE = re.compile(r"\s+")


def normalize_text(text: str) -> str:
    """Comparison form of a text: NFKC, plain quotes and dashes, one space, case-folded."""
    text = unicodedata.normalize("NFKC", text).translate(_TYPOGRAPHY)
    return _SPACE.sub(" ", text).strip().casefold()


@dataclass
class EvidenceCounts:
    """How gold evidence was mapped: exact / contained / fuzzy / normalized id / unmatched."""

    exact: int = 0
    contained: int = 0
    fuzzy: int = 0
    normalized: int = 0
    unmatched: int = 0
    unmatched_examples: list[str] = field(default_factory=list)

    def add(self, outcome: str, example: str | None = None) -> None:
        setattr(self, outcome, getattr(self, outcome) + 1)
        if outcome == "unmatched" and example is not None and len(self.unmatched_examples) < _MAX_EXAMPLES:
            self.unmatched_examples.append(example)

    def merge(self, other: EvidenceCounts) -> None:
        """Add ``other``'s counts (and its examples, up to the cap)."""
        for name in ("exact", "contained", "fuzzy", "normalized", "unmatched"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        room = max(0, _MAX_EXAMPLES - len(self.unmatched_examples))
        self.unmatched_examples.extend(other.unmatched_examples[:room])

    @property
    def total(self) -> int:
        return self.exact + self.contained + self.fuzzy + self.normalized + self.unmatched

    def as_dict(self) -> dict[str, object]:
        return {"exact": self.exact, "contained": self.contained, "fuzzy": self.fuzzy,
                "normalized": self.normalized, "unmatched": self.unmatched, "total": self.total,
                "unmatched_examples": list(self.unmatched_examples)}


@dataclass(frozen=True)
class SpanMatch:
    """Where one evidence span landed: a turn id (or ``None``), the outcome and the similarity."""

    turn_id: str | None
    outcome: str  # "exact" | "contained" | "fuzzy" | "unmatched"
    score: float


class SpanMatcher:
    """Matches evidence text spans to turns (exact → contained → fuzzy above ``threshold``)."""

    def __init__(self, threshold: float = DEFAULT_FUZZY_THRESHOLD):
        if not 0.0 < threshold <= 100.0:
            raise ValueError(f"fuzzy_threshold must be in (0, 100], got {threshold}")
        self.threshold = float(threshold)

    def match(self, span: str, turns: Sequence[Turn], role: str | None = None) -> SpanMatch:
        """Best turn for ``span`` among ``turns``; turns of ``role`` are preferred when given."""
        if role is not None:
            same_role = [t for t in turns if t.role == role]
            if same_role:
                found = self._match(span, same_role)
                if found.turn_id is not None:
                    return found
        return self._match(span, turns)

    def _match(self, span: str, turns: Sequence[Turn]) -> SpanMatch:
        stripped = span.strip()
        for turn in turns:
            if turn.text.strip() == stripped:
                return SpanMatch(turn.id, "exact", 100.0)
        norm = normalize_text(span)
        if not norm:
            return SpanMatch(None, "unmatched", 0.0)
        texts = [normalize_text(t.text) for t in turns]
        for turn, text in zip(turns, texts):
            if text == norm:
                return SpanMatch(turn.id, "exact", 100.0)
        if len(norm) >= _MIN_CONTAINED_CHARS:
            for turn, text in zip(turns, texts):
                if norm in text:
                    return SpanMatch(turn.id, "contained", 100.0)
            # the span may carry a lead-in the message lacks ("Exactly. <message>")
            for turn, text in zip(turns, texts):
                if len(text) >= _MIN_CONTAINED_CHARS and text in norm and len(text) >= 0.5 * len(norm):
                    return SpanMatch(turn.id, "contained", 100.0)
        best: tuple[float, float, str | None] = (0.0, 0.0, None)
        for turn, text in zip(turns, texts):
            ratio = fuzz.ratio(norm, text)
            score = ratio
            # partial alignment only for spans long enough or of comparable length: a short span
            # partially matches almost any long message
            shorter, longer = sorted((len(norm), len(text)))
            if longer and (shorter >= _MIN_PARTIAL_CHARS or shorter / longer >= 0.5):
                score = max(score, fuzz.partial_ratio(norm, text))
            if (score, ratio) > best[:2]:
                best = (score, ratio, turn.id)
        if best[2] is not None and best[0] >= self.threshold:
            return SpanMatch(best[2], "fuzzy", best[0])
        return SpanMatch(None, "unmatched", best[0])


_DIA_ID = re.compile(r"^D(\d+):(\d+)$")
_DIA_PAIR = re.compile(r"D\s*:?\s*(\d+)\s*[:.\-]\s*(\d+)", re.IGNORECASE)
_SEPARATORS = re.compile(r"[\s;,/&]+|and", re.IGNORECASE)
_BARE = re.compile(r"^D\s*:?\s*(\d+)$", re.IGNORECASE)


def normalize_dia_ids(raw: str, known: Iterable[str]) -> tuple[list[str], str]:
    """Turn one raw LoCoMo evidence entry into valid turn ids.

    Returns ``(ids, outcome)`` with outcome ``"exact"`` (already valid), ``"normalized"`` (rewritten
    unambiguously, e.g. ``"D1:3; D2:5"`` → two ids, ``"D:1:3"`` → ``"D1:3"``) or ``"unmatched"``
    (ids empty). A rewritten id must exist in ``known``; a bare ``"D13"`` is accepted only when exactly
    one split of its digits names a known turn *and* no session 13 exists (else it may be a turn id
    with its turn number lost, which is ambiguous).
    """
    known_set = known if isinstance(known, (set, frozenset)) else set(known)
    text = raw.strip()
    if _DIA_ID.match(text) and text in known_set:
        return [text], "exact"
    pairs = list(_DIA_PAIR.finditer(text))
    if pairs and not _SEPARATORS.sub("", _DIA_PAIR.sub("", text)):
        ids = [f"D{int(m.group(1))}:{int(m.group(2))}" for m in pairs]
        if all(i in known_set for i in ids):
            return ids, "normalized"
        return [], "unmatched"
    bare = _BARE.match(text)
    if bare:
        digits = bare.group(1)
        if any(k.startswith(f"D{int(digits)}:") for k in known_set):
            return [], "unmatched"
        candidates = {f"D{int(digits[:k])}:{int(digits[k:])}" for k in range(1, len(digits))}
        hits = sorted(c for c in candidates if c in known_set)
        if len(hits) == 1:
            return hits, "normalized"
    return [], "unmatched"
