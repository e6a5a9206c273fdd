"""A swapped-speaker probe of retrieval: each question asked with the other speaker's name.

LoCoMo's adversarial questions ask one speaker about what the other said ("Where does Priya volunteer?"
when Daniel does). The turn that was said is still the gold evidence (it is what shows the premise
wrong), but the name in the question points at the wrong speaker's units. Any LoCoMo-form data set gives
such a probe: ask each question that names exactly one of its dialogue's two speakers with the other's
name, and keep its gold turns (``qgmem eval-retrieval --swap-speakers``).
"""

from __future__ import annotations

import re

from qgmem.data.records import QA, Case


def names_in(question: str, speakers) -> list[str]:
    """The speakers (whole-word names) that ``question`` names, in ``speakers``' order."""
    return [name for name in speakers if re.search(rf"\b{re.escape(name)}\b", question)]


def swapped_speaker_cases(cases) -> tuple[list[Case], int]:
    """The cases with each question that names exactly one of the two speakers asked with the other's
    name (id ``<id>/swapped``, same category and gold turns), and how many questions were left out:
    those naming neither speaker or both, and every question of a dialogue without exactly two speakers."""
    out: list[Case] = []
    left_out = 0
    for case in cases:
        speakers = list(dict.fromkeys(t.speaker for t in case.dialogue.turns() if t.speaker))
        if len(speakers) != 2:
            left_out += len(case.qas)
            continue
        qas = []
        for q in case.qas:
            named = names_in(q.question, speakers)
            if len(named) != 1:
                left_out += 1
                continue
            other = speakers[1 - speakers.index(named[0])]
            swapped = re.sub(rf"\b{re.escape(named[0])}\b", other, q.question)
            qas.append(QA(id=f"{q.id}/swapped", question=swapped, answer="",
                          category=q.category, evidence_turn_ids=list(q.evidence_turn_ids),
                          question_time=q.question_time, meta=dict(q.meta)))
        out.append(Case(id=case.id, dialogue=case.dialogue, qas=qas, source=dict(case.source)))
    return out, left_out
