"""The one answer normalizer and the scores built on it (SQuAD convention).

Training metrics, the answer filter, ``qgmem eval-qa`` and serving all compare answers through
:func:`normalize_answer`, so a prediction judged correct in one place is correct in all of them. The
rule is SQuAD's (lower-case, punctuation removed, English articles removed, whitespace squeezed), so
scores agree with the published SQuAD script and ``torchmetrics``; two additions run first: a thinking
block (``<think>…</think>``) is dropped and typographic apostrophes become ASCII ones, so ``don’t`` and
``don't`` both normalize to ``dont``. Then dates and numbers take one written form: every absolute date
the project's time resolver (:mod:`qgmem.timeexpr`) reads becomes its ISO form (``7 May 2023``,
``May 7, 2023``, ``5/7/2023`` and ``2023-05-07`` are one answer; ``May 2023`` is ``2023-05``), and the
number words one to twenty become digits.
"""

from __future__ import annotations

import re
import string
from collections import Counter

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCT = frozenset(string.punctuation)
_THINK = re.compile(r"<think>.*?(</think>|$)", flags=re.DOTALL | re.IGNORECASE)
_QUOTES = str.maketrans({"\u2019": "'", "\u2018": "'", "\u201c": '"', "\u201d": '"'})

#: normalized phrases that say the memory does not hold the answer (matched at word boundaries)
ABSTAIN_PHRASES = (
    "no information", "not mentioned", "dont know", "do not know", "not enough information", "cannot answer",
    "cant answer", "unable to answer", "no record", "not available in", "doesnt contain", "does not contain",
    "not provided", "no mention",
)


_NUMBER_WORDS = {w: str(i) for i, w in enumerate(
    "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen sixteen "
    "seventeen eighteen nineteen twenty".split())}
_NUMBER_WORD = re.compile(r"\b(" + "|".join(_NUMBER_WORDS) + r")\b", re.IGNORECASE)
_THOUSANDS = re.compile(r"(?<=\d),(?=\d{3}\b)")


def canonical_dates_and_numbers(text: str) -> str:
    """Absolute dates in ISO form (through :mod:`qgmem.timeexpr`), number words as digits, ``1,000`` as ``1000``."""
    from qgmem.timeexpr import TIME_PATTERN, resolve_match

    def date_form(match: re.Match) -> str:
        if match.lastgroup not in ("iso", "numeric", "md", "dm", "my"):
            return match.group(0)
        span = resolve_match(match, None)  # no reference date: a date without a year stays as written
        if span is None:
            return match.group(0)
        if match.lastgroup == "my":
            return span.start.isoformat()[:7]
        return span.iso()

    text = TIME_PATTERN.sub(date_form, text)
    text = _THOUSANDS.sub("", text)
    return _NUMBER_WORD.sub(lambda m: _NUMBER_WORDS[m.group(1).lower()], text)


def strip_thinking(text: str) -> str:
    """``text`` without thinking blocks, whitespace trimmed: the one rule for every reply.

    Case does not matter (``<THINK>``), and an unclosed block runs to the end, so a reply still inside
    its reasoning has no answer yet.
    """
    return _THINK.sub(" ", text or "").strip()


def normalize_answer(text: str) -> str:
    """Lower-case, drop punctuation and articles, squeeze whitespace (thinking blocks removed, dates and
    numbers in one form first)."""
    text = canonical_dates_and_numbers(strip_thinking(text).translate(_QUOTES)).lower()
    text = "".join(ch for ch in text if ch not in _PUNCT)
    return " ".join(_ARTICLES.sub(" ", text).split())


def exact_match(prediction: str, reference: str) -> float:
    """1.0 when the normalized answers are equal, else 0.0."""
    return float(normalize_answer(prediction) == normalize_answer(reference))


def token_f1(prediction: str, reference: str) -> float:
    """Bag-of-tokens F1 of the normalized answers; 1.0 when both are empty, 0.0 when only one is."""
    pred, ref = normalize_answer(prediction).split(), normalize_answer(reference).split()
    if not pred or not ref:
        return float(pred == ref)
    common = sum((Counter(pred) & Counter(ref)).values())
    if common == 0:
        return 0.0
    precision, recall = common / len(pred), common / len(ref)
    return 2 * precision * recall / (precision + recall)


def contains_answer(prediction: str, reference: str) -> bool:
    """The normalized reference occurs in the normalized prediction as a whole-word span."""
    ref = normalize_answer(reference)
    return bool(ref) and f" {ref} " in f" {normalize_answer(prediction)} "


def is_abstention(text: str) -> bool:
    """Whether an answer says the information is not there (one of :data:`ABSTAIN_PHRASES`)."""
    norm = f" {normalize_answer(text)} "
    return any(f" {p} " in norm for p in ABSTAIN_PHRASES)
