"""The answer cut: how a decoded reply becomes the answer a user reads and a metric scores.

One rule for every place that cuts an answer (the answer filter, training's greedy metrics, eval-qa, the
pipeline and ``qgmem serve``), for every graph mode. A small LM reading graph tokens replies in shapes
that a plain first-line cut breaks: a lead-in line that holds no answer ("The answer is:" and a line
break) and a copied working-memory entry with its label and provenance (``[M5] Books have such an
awesome power. (Caroline; turn 98; said 20…``). The cut skips lead-in lines, takes off an inline lead-in,
and reduces an echoed entry to its fact; :func:`reply_shape` names the shape of the raw reply, so
``eval-qa`` can count what the tokens do before the repair.
"""

from __future__ import annotations

import re

from qgmem.prompting.entries import is_entry_echo, strip_entry
from qgmem.text import strip_thinking

#: bump when the cut's decisions change: it is part of the key of the answer filter's cached answers
ANSWER_CUT_VERSION = 2

#: the words of a lead-in phrase, slot by slot: each slot optional but ``answer`` ("So the final answer is")
_OPENERS, _ARTICLES, _KINDS, _CORES = ("so", "therefore", "here is"), ("the",), ("final", "short", "correct"), ("answer",)
_VERB = "is"


def _slot(words: tuple[str, ...], sep: str = r",?\s+") -> str:
    return "(?:" + "|".join(w.replace(" ", r"\s+") for w in words) + ")" + sep


_SPACE = r"\s+"
_PHRASE = ("(?:" + _slot(_OPENERS) + ")?(?:" + _slot(_ARTICLES, _SPACE) + ")?(?:" + _slot(_KINDS, _SPACE) + ")?"
           + _slot(_CORES, "") + "(?:" + _SPACE + _VERB + ")?")
#: every lead-in phrase in words, to tell a line being decoded that may still become one
_PHRASES = tuple(" ".join(w for w in (o, a, k, c, v) if w)
                 for o in ("",) + _OPENERS for a in ("",) + _ARTICLES for k in ("",) + _KINDS for c in _CORES
                 for v in ("", _VERB))
#: a whole line that is only a lead-in phrase ("Answer", "The answer is", "Here is the answer.")
_LEAD_IN = re.compile(rf"^{_PHRASE}\s*[:.]?$", re.IGNORECASE)
#: a lead-in opening a line that goes on with the answer ("The answer is: Paris", "Answer - Paris")
_INLINE_LEAD_IN = re.compile(rf"^{_PHRASE}\s*[:\-–]\s*(?=\S)|^(?:the\s+)?answer\s+is\s+(?=\S)", re.IGNORECASE)
#: the shapes :func:`reply_shape` names, all of them degenerate
SHAPES = ("empty", "lead_in", "entry")


def _bare(line: str) -> str:
    """A line without surrounding space and markdown emphasis (``**Answer:**``)."""
    return line.strip().strip("*_#> \t").strip()


def is_lead_in(line: str) -> bool:
    """Whether ``line`` holds no answer but introduces one: a lead-in phrase alone, or any line that ends
    with a colon (what follows the colon would be the answer)."""
    bare = _bare(line)
    return bool(bare) and (bare.endswith(":") or bool(_LEAD_IN.match(bare)))


def answer_line(text: str) -> str:
    """The first non-empty line that is not a lead-in (``""`` when there is none)."""
    return next((line for line in text.splitlines() if line.strip() and not is_lead_in(line)), "")


def holds_answer_line(text: str) -> bool:
    """Whether ``text`` has a complete line (one a line break ended) that :func:`answer_line` would take:
    generation may stop at a line break only then."""
    return any(line.strip() and not is_lead_in(line) for line in text.split("\n")[:-1])


def repair(line: str) -> str:
    """The answer in ``line``: an inline lead-in taken off, an echoed entry reduced to its fact. A line
    that would be left empty (a bare ``[M3]``) is kept as it was."""
    text = line.strip()
    text = _INLINE_LEAD_IN.sub("", text, count=1).strip() or text
    if is_entry_echo(text):
        text = strip_entry(text) or text
    return text.strip()


def _may_become_lead_in_or_label(line: str) -> bool:
    """Whether a line still being decoded may turn out a lead-in or an entry label: it is one already, it
    is the start of a lead-in phrase, or the start of a label (``[M``)."""
    bare = _bare(line)
    if not bare or is_lead_in(bare) or re.fullmatch(r"\W{0,3}(?:\[(?:M\d*\]?)?)?\W{0,3}", bare):
        return True
    if not re.fullmatch(r"[A-Za-z ,]+", bare):
        return False
    words = " ".join(re.findall(r"[a-z]+", bare.lower()))
    return any(phrase.startswith(words) for phrase in _PHRASES)


def shown_so_far(text: str) -> tuple[str, bool]:
    """The answer a reply being decoded has given so far, for streaming: ``(answer, complete)``.

    The answer is :func:`final_answer`'s as far as it is known, so what is streamed is always the start of
    the final answer: complete lead-in lines are skipped, a line that may still become a lead-in or an
    entry label is held back, and an open parenthesis (a provenance, maybe) waits until it closes."""
    ended = "\n" in text[len(text.rstrip()):]  # strip_thinking trims the line break that ends a line
    *complete, partial = (strip_thinking(text) + ("\n" if ended else "")).split("\n")
    line = next((line for line in complete if line.strip() and not is_lead_in(line)), None)
    if line is not None:
        return repair(line), True
    if _may_become_lead_in_or_label(partial):
        return "", False
    shown = repair(partial)
    return shown[:shown.index("(")].rstrip() if "(" in shown[shown.rfind(")") + 1:] else shown, False


def final_answer(text: str, first_line: bool = True) -> str:
    """The scored answer: thinking removed, then the first line that holds an answer (or all of it),
    repaired (:func:`repair`) and trimmed."""
    text = strip_thinking(text)
    if first_line:
        text = answer_line(text)
    return repair(text) if text.strip() else ""


def reply_shape(text: str) -> str | None:
    """The degenerate shape of a raw reply, read as the plain first-line rule would: ``empty`` (no
    non-empty line), ``lead_in`` (its first line is a lead-in), ``entry`` (its first line is an echoed
    entry); ``None`` for an answer."""
    line = next((line for line in strip_thinking(text).splitlines() if line.strip()), "")
    if not line:
        return "empty"
    if is_lead_in(line):
        return "lead_in"
    if is_entry_echo(line):
        return "entry"
    return None


__all__ = ["ANSWER_CUT_VERSION", "SHAPES", "answer_line", "final_answer", "holds_answer_line", "is_lead_in",
           "repair", "reply_shape", "shown_so_far"]
