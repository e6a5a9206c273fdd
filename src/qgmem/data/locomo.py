"""LoCoMo (``locomo10.json`` form) → :class:`Case` records, one case per conversation sample.

A sample is ``{qa, conversation, event_summary, observation, session_summary, sample_id}``;
``conversation`` holds ``speaker_a``/``speaker_b``, ``session_N_date_time`` ("1:56 pm on 8 May, 2023")
and ``session_N`` = ``[{speaker, dia_id: "D1:3", text, img_url?, blip_caption?, query?}]``.

Turn ids are the ``dia_id`` s, so gold evidence ids need no mapping beyond normalising the malformed
ones. Session dates become ISO utterance times on every turn of the session. An image caption is part
of what was said, so it is appended to the turn text. The summaries and observations are generated
annotations, not conversation, and are not loaded (they would leak answers into memory).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from qgmem.data._common import DEFAULT_MAX_TURN_CHARS, LoadContext, LoadedData, load_json_lists, need, need_text
from qgmem.data.dates import to_iso
from qgmem.data.errors import DataFormatError
from qgmem.data.evidence import normalize_dia_ids
from qgmem.data.records import QA, Case, Dialogue, Session, Turn

#: LoCoMo's integer categories and their names (the number is kept in ``QA.meta["category_id"]``)
CATEGORIES = {1: "multi-hop", 2: "temporal", 3: "open-domain", 4: "single-hop", 5: "adversarial"}
#: the reference answer of an unanswerable (adversarial) question in LoCoMo's own evaluation
ABSTAIN_ANSWER = "Not mentioned in the conversation"
_SESSION = re.compile(r"^session_(\d+)$")


def load_locomo(path: str | Path, *, strict: bool = True, adversarial_gold: str = "adversarial_answer",
                max_turn_chars: int = DEFAULT_MAX_TURN_CHARS) -> LoadedData:
    """Read a LoCoMo JSON file (or every ``*.json`` in a folder) into cases.

    ``adversarial_gold`` chooses the answer of a category-5 question that has no ``answer``:
    ``"adversarial_answer"`` (the field's text) or ``"abstain"`` (:data:`ABSTAIN_ANSWER`, which is what
    LoCoMo's evaluation scores as correct). Both keep the other text in ``QA.meta``. A turn longer than
    ``max_turn_chars`` is cut there (counted in ``report["truncated_turns"]``).
    """
    if adversarial_gold not in ("adversarial_answer", "abstain"):
        raise ValueError(f"adversarial_gold must be 'adversarial_answer' or 'abstain', got {adversarial_gold!r}")
    ctx, cases = load_json_lists("locomo", path, strict, "samples",
                                 lambda raw, rel, i, ctx: _sample(raw, rel, i, ctx, adversarial_gold),
                                 id_kind="sample_id", max_turn_chars=max_turn_chars)
    return LoadedData(cases=cases, report=ctx.report(cases, {"adversarial_gold": adversarial_gold,
                                                             "max_turn_chars": max_turn_chars}))


def _sample(raw: Any, rel: str, i: int, ctx: LoadContext, adversarial_gold: str) -> Case:
    sample_id = need(raw, "sample_id", (str, int), file=rel, item=i, optional=True, default=None)
    sample_id = str(sample_id) if sample_id is not None else f"{Path(rel).stem}-{i}"
    conv = need(raw, "conversation", dict, file=rel, item=i)
    speakers = {need(conv, k, str, file=rel, item=i, where="conversation"): k for k in ("speaker_a", "speaker_b")}
    numbers = sorted(int(m.group(1)) for k in conv if (m := _SESSION.match(k)))
    if not numbers:
        raise DataFormatError("no session_N lists", file=rel, item=i, field="conversation.session_1")
    sessions: list[Session] = []
    dia_places: dict[str, str] = {}  # dia_id -> where it was first used
    for n in numbers:
        key = f"session_{n}"
        turns_raw = need(conv, key, list, file=rel, item=i, where="conversation")
        if not turns_raw:
            raise DataFormatError("empty conversation (no turns)", file=rel, item=i, field=f"conversation.{key}")
        date_raw = need(conv, f"{key}_date_time", str, file=rel, item=i, where="conversation")
        try:
            time = to_iso(date_raw)
        except ValueError as exc:
            raise DataFormatError(f"unparseable date {date_raw!r}", file=rel, item=i,
                                  field=f"conversation.{key}_date_time") from exc
        sid = f"S{n}"
        turns = []
        for j, t in enumerate(turns_raw):
            w = f"conversation.{key}[{j}]"
            speaker = need(t, "speaker", str, file=rel, item=i, where=w)
            if speaker not in speakers:
                raise DataFormatError(f"unknown speaker {speaker!r} (expected speaker_a {conv['speaker_a']!r} "
                                      f"or speaker_b {conv['speaker_b']!r})", file=rel, item=i, field=f"{w}.speaker")
            text = need(t, "text", str, file=rel, item=i, where=w)
            caption = need(t, "blip_caption", str, file=rel, item=i, where=w, optional=True, nullable=True)
            if caption:
                text = f"{text} [shares an image: {caption}]" if text else f"[shares an image: {caption}]"
            text = ctx.cap_turn(text, file=rel, item=i, field=f"{w}.text")
            dia_id = need(t, "dia_id", str, file=rel, item=i, where=w).strip()
            if dia_id in dia_places:
                raise DataFormatError(f"repeated dia_id {dia_id!r}: already used at {dia_places[dia_id]}",
                                      file=rel, item=i, field=f"{w}.dia_id")
            dia_places[dia_id] = f"conversation.{key}[{j}]"
            turns.append(Turn(id=dia_id, session_id=sid, speaker=speaker, role=speakers[speaker], text=text,
                              time=time))
        sessions.append(Session(id=sid, turns=turns, time=time, meta={"date_time": date_raw}))
    dialogue = Dialogue(id=sample_id, sessions=sessions,
                        meta={"speaker_a": conv["speaker_a"], "speaker_b": conv["speaker_b"]})
    dialogue.reindex()
    known = set(dia_places)
    qas = [_qa(q, rel, i, j, sample_id, known, ctx, adversarial_gold, sessions[-1].time)
           for j, q in enumerate(need(raw, "qa", list, file=rel, item=i))]
    return Case(id=sample_id, dialogue=dialogue, qas=qas,
                source={"dataset": "locomo", "file": rel, "item": i, "person_id": sample_id,
                        "speakers": [conv["speaker_a"], conv["speaker_b"]]})


def _qa(raw: Any, rel: str, i: int, j: int, sample_id: str, known: set[str], ctx: LoadContext,
        adversarial_gold: str, last_time: str | None) -> QA:
    w = f"qa[{j}]"
    question = need_text(raw, "question", str, file=rel, item=i, where=w)
    cat_id = need(raw, "category", int, file=rel, item=i, where=w)
    if cat_id not in CATEGORIES:
        raise DataFormatError(f"unknown category {cat_id} (expected 1-5)", file=rel, item=i, field=f"{w}.category")
    meta: dict[str, Any] = {"category_id": cat_id, "reference_time": last_time}
    answer = need_text(raw, "answer", (str, int, float), file=rel, item=i, where=w, optional=True)
    adversarial = need(raw, "adversarial_answer", (str, int, float), file=rel, item=i, where=w, optional=True)
    if adversarial is not None:
        meta["adversarial_answer"] = str(adversarial)
    if answer is None:
        if adversarial is None:
            raise DataFormatError("missing field (neither 'answer' nor 'adversarial_answer')", file=rel,
                                  item=i, field=f"{w}.answer")
        answer = ABSTAIN_ANSWER if adversarial_gold == "abstain" else adversarial
        meta["answer_source"] = adversarial_gold
        meta["unanswerable"] = True
    evidence_raw = need(raw, "evidence", list, file=rel, item=i, where=w, optional=True, default=[])
    evidence: list[str] = []
    raw_ids = []
    for k, e in enumerate(evidence_raw):
        if not isinstance(e, str):
            raise DataFormatError(f"expected string, got {type(e).__name__}", file=rel, item=i,
                                  field=f"{w}.evidence[{k}]")
        raw_ids.append(e)
        ids, outcome = normalize_dia_ids(e, known)
        for _ in ids or [None]:
            ctx.evidence.add(outcome, f"{sample_id} {w}: {e!r}")
        evidence.extend(x for x in ids if x not in evidence)
    if raw_ids != evidence:
        meta["evidence_raw"] = raw_ids
    return QA(id=f"{sample_id}#q{j}", question=question, answer=str(answer), category=CATEGORIES[cat_id],
              evidence_turn_ids=evidence, meta=meta)
