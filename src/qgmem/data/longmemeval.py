"""LongMemEval (``longmemeval_s`` / ``longmemeval_oracle`` form) → :class:`Case` records.

Each entry is one question over its own haystack: ``{question_id, question_type, question, answer,
question_date, haystack_session_ids, haystack_dates, haystack_sessions: [[{role, content,
has_answer?}]], answer_session_ids}``. One entry → one case with one QA. Turns flagged ``has_answer``
are the gold evidence (no text matching needed); ``question_type`` is the category; dates become ISO.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from qgmem.data._common import DEFAULT_MAX_TURN_CHARS, LoadContext, LoadedData, load_json_lists, need, need_text
from qgmem.data.dates import to_iso
from qgmem.data.errors import DataFormatError
from qgmem.data.records import QA, Case, Dialogue, Session, Turn

_ROLES = ("user", "assistant")


def load_longmemeval(path: str | Path, *, strict: bool = True,
                     max_turn_chars: int = DEFAULT_MAX_TURN_CHARS) -> LoadedData:
    """Read a LongMemEval JSON file (or every ``*.json`` in a folder) into cases.

    ``question_id`` s must be unique; a turn longer than ``max_turn_chars`` is cut there (counted).
    """
    ctx, cases = load_json_lists("longmemeval", path, strict, "questions", _entry, id_kind="question_id",
                                 max_turn_chars=max_turn_chars)
    return LoadedData(cases=cases, report=ctx.report(cases, {"max_turn_chars": max_turn_chars}))


def _iso(value: str, rel: str, i: int, field: str) -> str:
    try:
        return to_iso(value)
    except ValueError as exc:
        raise DataFormatError(f"unparseable date {value!r}", file=rel, item=i, field=field) from exc


def _entry(raw: Any, rel: str, i: int, ctx: LoadContext) -> Case:
    def get(key, types, **kw):
        return need(raw, key, types, file=rel, item=i, **kw)

    qid = str(get("question_id", (str, int)))
    qtype = get("question_type", str)
    question = need_text(raw, "question", str, file=rel, item=i)
    answer = need_text(raw, "answer", (str, int, float), file=rel, item=i)
    question_time = _iso(get("question_date", str), rel, i, "question_date")
    ids = get("haystack_session_ids", list)
    dates = get("haystack_dates", list)
    sessions_raw = get("haystack_sessions", list)
    if not (len(ids) == len(dates) == len(sessions_raw)):
        raise DataFormatError(f"haystack_session_ids ({len(ids)}), haystack_dates ({len(dates)}) and "
                              f"haystack_sessions ({len(sessions_raw)}) differ in length", file=rel, item=i,
                              field="haystack_sessions")
    answer_sessions = [str(s) for s in get("answer_session_ids", list, optional=True, default=[])]
    seen: dict[str, int] = {}
    sessions: list[Session] = []
    evidence: list[str] = []
    for k, (sid_raw, date_raw, turns_raw) in enumerate(zip(ids, dates, sessions_raw)):
        if not isinstance(sid_raw, (str, int)):
            raise DataFormatError(f"expected string, got {type(sid_raw).__name__}", file=rel, item=i,
                                  field=f"haystack_session_ids[{k}]")
        if not isinstance(date_raw, str):
            raise DataFormatError(f"expected string, got {type(date_raw).__name__}", file=rel, item=i,
                                  field=f"haystack_dates[{k}]")
        if not isinstance(turns_raw, list):
            raise DataFormatError(f"expected list, got {type(turns_raw).__name__}", file=rel, item=i,
                                  field=f"haystack_sessions[{k}]")
        if not turns_raw:
            raise DataFormatError("empty conversation (no turns)", file=rel, item=i, field=f"haystack_sessions[{k}]")
        sid = base = str(sid_raw)
        if base in seen:  # two sessions under one id: evidence and answer_session_ids would be ambiguous
            raise DataFormatError(f"repeated session id {base!r}: already haystack_session_ids[{seen[base]}]",
                                  file=rel, item=i, field=f"haystack_session_ids[{k}]")
        seen[base] = k
        time = _iso(date_raw, rel, i, f"haystack_dates[{k}]")
        turns = []
        for t, turn in enumerate(turns_raw):
            w = f"haystack_sessions[{k}][{t}]"
            role = need(turn, "role", str, file=rel, item=i, where=w)
            if role not in _ROLES:
                raise DataFormatError(f"unknown role {role!r} (expected 'user' or 'assistant')", file=rel,
                                      item=i, field=f"{w}.role")
            content = ctx.cap_turn(need(turn, "content", str, file=rel, item=i, where=w), file=rel, item=i,
                                   field=f"{w}.content")
            tid = f"{sid}:{t}"
            if need(turn, "has_answer", bool, file=rel, item=i, where=w, optional=True, default=False):
                evidence.append(tid)
                ctx.evidence.add("exact")
            turns.append(Turn(id=tid, session_id=sid, speaker=role, role=role, text=content, time=time))
        sessions.append(Session(id=sid, turns=turns, time=time, meta={"date": date_raw,
                                                                      "answer_session": base in answer_sessions}))
    if not sessions:
        raise DataFormatError("no haystack sessions", file=rel, item=i, field="haystack_sessions")
    dialogue = Dialogue(id=qid, sessions=sessions)
    dialogue.reindex()
    qa = QA(id=f"{qid}#q0", question=question, answer=str(answer), category=qtype, evidence_turn_ids=evidence,
            question_time=question_time,
            meta={"question_id": qid, "abstention": qid.endswith("_abs"), "answer_session_ids": answer_sessions})
    return Case(id=qid, dialogue=dialogue, qas=[qa],
                source={"dataset": "longmemeval", "file": rel, "item": i, "question_type": qtype,
                        "answer_session_ids": answer_sessions})
