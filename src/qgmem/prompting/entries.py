"""The written form of a working-memory entry: ``[Mi] fact (speaker; turn i; happened …; said …)``.

One home for the writer (:mod:`qgmem.activation.serialize`) and its readers: the prompt's cut to the top
entries (:mod:`qgmem.prompting.contract`) and the answer cut, which takes the label and the provenance
off an entry a reply echoes (:mod:`qgmem.prompting.answer`). The patterns are built from the same words
the writer uses, so a change to the form changes both.
"""

from __future__ import annotations

import re

#: the parts of an entry's provenance, in the order written, and what separates them
TURN, TURNS, HAPPENED, SAID, SEPARATOR = "turn", "turns", "happened", "said", "; "

#: an entry's label at the start of a line of the working memory (the label's number is group 1)
ENTRY = re.compile(r"^\[M(\d+)\] ", re.MULTILINE)
#: an entry's label opening a reply, with what a reply puts after it (``[M5]``, ``[M5]:``, ``**[M5]**``)
LABEL_OPENING = re.compile(r"^\W{0,3}\[M\d+\]\W{0,3}\s*")
#: a provenance from its opening parenthesis to the end of the line, as the writer starts it: an optional
#: speaker, then the turn label (what follows it, happened/said, a trajectory, a source, is cut with it)
PROVENANCE_TAIL = re.compile(rf"\s*\((?:[^()\n;]{{0,80}}{re.escape(SEPARATOR.strip())}\s*)?(?:{TURNS}|{TURN}) \d[^\n]*$")
#: a provenance cut short by the answer length: a parenthesis still open at the end of the line, past a separator
CUT_PROVENANCE = re.compile(rf"\s*\([^()\n]*{re.escape(SEPARATOR.strip())}[^()\n]*$")
#: a line that is a provenance and nothing else, its parentheses lost (``User; turn 97``)
BARE_PROVENANCE = re.compile(rf"^\(?(?:[^;()\n]{{0,80}}{re.escape(SEPARATOR.strip())}\s*)?(?:{TURNS}|{TURN}) \d[^\n]*$")
#: a parenthesis still open at the end of a reply, as when the answer length cut a provenance short
OPEN_TAIL = re.compile(r"\s*\([^()\n]*$")


def label(position: int) -> str:
    """``[M3]``: the label of the working memory's entry at 1-based ``position``."""
    return f"[M{position}]"


def turn_label(order: int, turns: int) -> str:
    """``turn 12`` or ``turns 12-13``: positions in the dialogue (ids like UUIDs would cost ~20 tokens each)."""
    return f"{TURN} {order}" if turns <= 1 else f"{TURNS} {order}-{order + turns - 1}"


def provenance(speaker: str | None, turns: str, fact_time: str | None, said: str | None) -> str:
    """``(speaker; turn i; happened <fact time>; said <date>)``, the parts that are known."""
    parts = ([speaker] if speaker else []) + [turns]
    if fact_time:
        parts.append(f"{HAPPENED} {fact_time}")
    if said:
        parts.append(f"{SAID} {said}")
    return f"({SEPARATOR.join(parts)})"


def entry(position: int, fact: str, meta: str) -> str:
    """``[Mi] fact (meta)``: one entry's first part, as the working memory writes it."""
    return f"{label(position)} {fact} {meta}"


def is_entry_echo(line: str) -> bool:
    """Whether ``line`` reads as a copied entry: it opens with a label, carries an entry's provenance (whole
    or cut short), or is one."""
    text = line.strip()
    return bool(LABEL_OPENING.match(text) or PROVENANCE_TAIL.search(text) or CUT_PROVENANCE.search(text)
                or BARE_PROVENANCE.match(text))


def strip_entry(line: str) -> str:
    """An echoed entry's fact: its label and its provenance (with what follows it, or cut short) taken off;
    a provenance alone leaves nothing. A reply that opens with a label also loses a parenthesis left open
    at its end."""
    text = line.strip()
    labelled = LABEL_OPENING.match(text)
    if labelled:
        text = text[labelled.end():]
    text = CUT_PROVENANCE.sub("", PROVENANCE_TAIL.sub("", text))
    if BARE_PROVENANCE.match(text):
        text = ""
    if labelled:
        text = OPEN_TAIL.sub("", text)
    return text.strip()


__all__ = ["BARE_PROVENANCE", "CUT_PROVENANCE", "ENTRY", "HAPPENED", "LABEL_OPENING", "OPEN_TAIL", "PROVENANCE_TAIL", "SAID", "SEPARATOR", "TURN", "TURNS",
           "entry", "is_entry_echo", "label", "provenance", "strip_entry", "turn_label"]
