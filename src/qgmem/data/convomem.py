"""ConvoMem (``Salesforce/ConvoMem``) → :class:`Case` records, one case per evidence item.

Two on-disk forms are read:

* core ``core_benchmark/evidence_questions/<category>/<N>_evidence/<person>_<Role>.json`` =
  ``{"evidence_items": [...], "checkpoint": ...}``. Each item holds only its own evidence
  conversation(s), so a history is built around it from other items of the same person
  (:mod:`qgmem.data.convomem_history`);
* pre-mixed ``core_benchmark/pre_mixed_testcases/<category>/<N>_evidence/batched_NNN.json`` = a list
  of ``{"evidenceItems": [...], "conversations": [...], "contextSize": int}``; the mixed
  conversations are used as they are and every evidence item of a group shares that history.

The benchmark category comes from the folder name; the item's own ``category`` is a life-area label
and is kept in ``QA.meta["life_area"]``. ConvoMem has no timestamps: order is the only time.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from qgmem.data._common import DEFAULT_MAX_TURN_CHARS, LoadContext, LoadedData, need, need_text, read_json
from qgmem.data.errors import DataFormatError
from qgmem.data.convomem_history import (DEFAULT_DISTRACTORS, Conversation, Message, case_rng, draw_distractors,
                                         interleave, to_dialogue)
from qgmem.data.evidence import DEFAULT_FUZZY_THRESHOLD, SpanMatcher
from qgmem.data.records import QA, Case, Dialogue

BENCHMARK_CATEGORIES = (
    "user_evidence",
    "assistant_facts_evidence",
    "changing_evidence",
    "abstention_evidence",
    "preference_evidence",
    "implicit_connection_evidence",
)
_N_DIR = re.compile(r"^(\d+)_evidence$")
_ROLES = {"user": "user", "assistant": "assistant"}


@dataclass
class _Item:
    """One evidence item, validated, before its history is built."""

    key: str  # "<file without .json>#<index>" (pre-mixed: "#<group>/<index>")
    file: str
    index: int | str
    category: str
    evidence_count: int
    question: str
    answer: str
    person_id: str
    spans: list[tuple[str | None, str]]  # (role, text)
    conversations: list[Conversation]
    meta: dict[str, Any] = field(default_factory=dict)
    source: dict[str, Any] = field(default_factory=dict)


def load_convomem(path: str | Path, *, strict: bool = True,
                  distractor_conversations: int = DEFAULT_DISTRACTORS, seed: int = 0,
                  fuzzy_threshold: float = DEFAULT_FUZZY_THRESHOLD, form: str = "auto",
                  max_turn_chars: int = DEFAULT_MAX_TURN_CHARS) -> LoadedData:
    """Read a local ConvoMem folder (or file, or the hub id where a network exists) into cases.

    ``form`` picks the files: ``"core"`` (evidence_questions), ``"pre_mixed"`` (pre_mixed_testcases)
    or ``"auto"`` (core files when there are any, else pre-mixed ones). The two forms hold the same
    evidence items, so reading both would count items twice.

    A conversation id used by two evidence items of one person (core) is an error naming both places
    (lenient: the later item is skipped); a message longer than
    ``max_turn_chars`` is cut there (counted in ``report["truncated_turns"]``).
    """
    if not isinstance(distractor_conversations, int) or distractor_conversations < 0:
        raise ValueError(f"distractor_conversations must be an integer >= 0, got {distractor_conversations!r}")
    if form not in ("auto", "core", "pre_mixed"):
        raise ValueError(f"form must be 'auto', 'core' or 'pre_mixed', got {form!r}")
    root = _resolve(path, form)
    ctx = LoadContext("convomem", root if root.is_dir() else root.parent, strict, max_turn_chars)
    matcher = SpanMatcher(fuzzy_threshold)
    core: list[_Item] = []
    cases: list[Case] = []
    forms = {"core": 0, "pre_mixed": 0}
    files = _discover(root)
    premixed = {f for f in files if "pre_mixed_testcases" in f.resolve().parts}
    if form == "auto":
        form = "core" if len(premixed) < len(files) else "pre_mixed"
    files = [f for f in files if (f in premixed) == (form == "pre_mixed")]
    if not files:
        raise FileNotFoundError(f"no {form} ConvoMem files under {root}")
    for file in files:
        rel = ctx.rel(file)
        category, count = file.parent.parent.name, int(_N_DIR.match(file.parent.name).group(1))
        if category not in BENCHMARK_CATEGORIES:
            ctx.fail(DataFormatError(f"unknown category folder {category!r} (expected one of "
                                     f"{', '.join(BENCHMARK_CATEGORIES)})", file=rel, field="<category folder>"))
            continue
        try:
            doc = read_json(file, rel)
        except DataFormatError as exc:
            ctx.fail(exc)
            continue
        ctx.files_read.append(rel)
        if file in premixed:
            forms["pre_mixed"] += 1
            cases.extend(_premixed_cases(doc, rel, category, count, ctx, matcher))
        else:
            forms["core"] += 1
            core.extend(_core_items(doc, rel, category, count, ctx, file.stem))
    cases = _core_cases(_unique_conversations(core, ctx), distractor_conversations, seed, ctx, matcher) + cases
    report = ctx.report(cases, {"distractor_conversations": distractor_conversations, "seed": seed,
                                "fuzzy_threshold": fuzzy_threshold, "form": form, "max_turn_chars": max_turn_chars})
    report["forms"] = forms
    report["persons"] = len({c.source["person_id"] for c in cases})
    return LoadedData(cases=cases, report=report)


def _resolve(path: str | Path, form: str) -> Path:
    """A local path as given; a hub id (``owner/name`` that is not a local path) is downloaded."""
    local = Path(path)
    if local.exists():
        return local
    text = str(path)
    if re.fullmatch(r"[\w.-]+/[\w.-]+", text):
        folder = "pre_mixed_testcases" if form == "pre_mixed" else "evidence_questions"
        try:
            from huggingface_hub import snapshot_download

            return Path(snapshot_download(repo_id=text, repo_type="dataset",
                                          allow_patterns=[f"core_benchmark/{folder}/**"]))
        except Exception as exc:  # offline, unknown repo, no permission: say what was tried
            raise FileNotFoundError(f"{text!r} is not a local path and could not be fetched from the "
                                    f"Hugging Face hub ({type(exc).__name__}: {exc})") from exc
    raise FileNotFoundError(f"no such file or folder: {text}")


def _discover(root: Path) -> list[Path]:
    """The ``<category>/<N>_evidence/*.json`` files under ``root`` (or ``root`` itself), sorted."""
    if root.is_file():
        files = [root]
    else:
        files = sorted(p for p in root.rglob("*.json") if _N_DIR.match(p.parent.name))
    if not files or any(not _N_DIR.match(p.parent.name) for p in files):
        raise FileNotFoundError(f"no ConvoMem files under {root}: expected "
                                "core_benchmark/evidence_questions/<category>/<N>_evidence/*.json")
    return files


def _core_items(doc: Any, rel: str, category: str, count: int, ctx: LoadContext, stem: str) -> list[_Item]:
    if not isinstance(doc, dict):
        ctx.fail(DataFormatError(f"expected an object with 'evidence_items', got {type(doc).__name__}",
                                 file=rel, field="<document>"))
        return []
    try:
        items = need(doc, "evidence_items", list, file=rel, item=None)
    except DataFormatError as exc:
        ctx.fail(exc)
        return []
    base = rel.removesuffix(".json")
    person_from_name = stem.split("_", 1)[0] if "_" in stem else None
    role_from_name = stem.split("_", 1)[1] if "_" in stem else None
    out = []
    for i, raw in enumerate(items):
        ctx.items += 1
        try:
            item = _parse_item(raw, f"{base}#{i}", rel, i, category, count, person_from_name,
                               conv_key="conversations", ctx=ctx)
        except DataFormatError as exc:
            ctx.fail(exc)
            continue
        item.source.update({"form": "core", "persona_role": role_from_name})
        out.append(item)
    return out


def _parse_item(raw: Any, key: str, rel: str, index: int | str, category: str, count: int,
                person_fallback: str | None, conv_key: str, ctx: LoadContext, where: str = "",
                require_conversations: bool = True) -> _Item:
    """Validate one evidence item (snake_case fields, as in both forms)."""
    def get(k, types, **kw):
        return need(raw, k, types, file=rel, item=index, where=where, **kw)

    question = need_text(raw, "question", str, file=rel, item=index, where=where)
    answer = need_text(raw, "answer", (str, int, float), file=rel, item=index, where=where)
    spans_raw = get("message_evidences", list)
    spans: list[tuple[str | None, str]] = []
    for j, ev in enumerate(spans_raw):
        w = f"{where + '.' if where else ''}message_evidences[{j}]"
        speaker = need(ev, "speaker", str, file=rel, item=index, where=w, optional=True)
        spans.append((_ROLES.get(speaker.lower()) if speaker else None,
                      need(ev, "text", str, file=rel, item=index, where=w)))
    convs_raw = get(conv_key, list, optional=not require_conversations, default=[])
    conversations = [
        parse_conversation(c, key, rel, index, f"{where + '.' if where else ''}{conv_key}[{j}]", ctx)
        for j, c in enumerate(convs_raw)
    ]
    if require_conversations and not conversations:
        raise DataFormatError("an item needs at least one conversation", file=rel, item=index,
                              field=f"{where + '.' if where else ''}{conv_key}")
    person = get("personId", str, optional=True) or person_fallback
    if not person:
        raise DataFormatError("missing field (and no <person>_<Role>.json file name to fall back on)",
                              file=rel, item=index, field=f"{where + '.' if where else ''}personId")
    meta = {
        "life_area": get("category", str, optional=True),
        "scenario_description": get("scenario_description", str, optional=True),
        "evidence_count": count,
        "use_case_model_name": get("use_case_model_name", str, optional=True, nullable=True),
        "core_model_name": get("core_model_name", str, optional=True, nullable=True),
    }
    return _Item(key=key, file=rel, index=index, category=category, evidence_count=count,
                 question=question, answer=str(answer), person_id=person, spans=spans,
                 conversations=conversations, meta=meta,
                 source={"dataset": "convomem", "file": rel, "item": index, "person_id": person,
                         "benchmark_category": category, "evidence_count": count})


def parse_conversation(raw: Any, owner: str, rel: str, index: int | str, where: str,
                       ctx: LoadContext | None = None) -> Conversation:
    """One ``{messages: [{speaker, text}], id, containsEvidence, model_name}``; empty ones are errors.

    With ``ctx``, a message longer than its ``max_turn_chars`` is cut (and counted).
    """
    messages_raw = need(raw, "messages", list, file=rel, item=index, where=where)
    if not messages_raw:
        raise DataFormatError("empty conversation (no messages)", file=rel, item=index, field=f"{where}.messages")
    messages = []
    for k, m in enumerate(messages_raw):
        w = f"{where}.messages[{k}]"
        speaker = need(m, "speaker", str, file=rel, item=index, where=w)
        role = _ROLES.get(speaker.lower())
        if role is None:
            raise DataFormatError(f"unknown speaker {speaker!r} (expected 'User' or 'Assistant')",
                                  file=rel, item=index, field=f"{w}.speaker")
        text = need(m, "text", str, file=rel, item=index, where=w)
        if ctx is not None:
            text = ctx.cap_turn(text, file=rel, item=index, field=f"{w}.text")
        messages.append(Message(speaker=speaker, role=role, text=text))
    conv_id = need(raw, "id", str, file=rel, item=index, where=where, optional=True, default="")
    meta = {"contains_evidence": need(raw, "containsEvidence", bool, file=rel, item=index, where=where,
                                      optional=True, nullable=True),
            "model_name": need(raw, "model_name", str, file=rel, item=index, where=where, optional=True,
                               nullable=True)}
    return Conversation(id=conv_id, messages=messages, owner=owner, meta=meta)


def _unique_conversations(items: list[_Item], ctx: LoadContext) -> list[_Item]:
    """Items whose conversation ids no earlier item of the same person uses (distractors come from that pool).

    One conversation claimed by two items would be one item's evidence and another's distractor, or
    appear twice in a history; the error names both places (lenient: the later item is skipped). A
    repeat *inside* one item is kept as two sessions (``id~2``), as documented.
    """
    first_use: dict[tuple[str, str], str] = {}
    kept = []
    for item in items:
        try:
            mine: dict[tuple[str, str], str] = {}
            for j, conv in enumerate(item.conversations):
                key = (item.person_id, conv.id)
                if conv.id and key in first_use:
                    raise DataFormatError(f"duplicate conversation id {conv.id!r} of person {item.person_id!r}: "
                                          f"already used at {first_use[key]}", file=item.file, item=item.index,
                                          field=f"conversations[{j}].id")
                mine.setdefault(key, f"file {item.file}, item {item.index}, field conversations[{j}].id")
        except DataFormatError as exc:
            ctx.fail(exc)
            continue
        first_use.update(mine)
        kept.append(item)
    return kept


def _core_cases(items: list[_Item], n_distractors: int, seed: int, ctx: LoadContext,
                matcher: SpanMatcher) -> list[Case]:
    pools: dict[str, list[Conversation]] = {}
    for item in items:
        pools.setdefault(item.person_id, []).extend(item.conversations)
    cases = []
    for item in items:
        rng = case_rng(seed, item.key)
        distractors = draw_distractors(pools[item.person_id], item.key, {c.id for c in item.conversations},
                                       n_distractors, rng)
        mixed, positions = interleave(item.conversations, distractors, rng)
        slots = set(positions)
        session_meta = [{"origin": "evidence" if p in slots else "distractor", "source_item": c.owner}
                        for p, c in enumerate(mixed)]
        dialogue = to_dialogue(item.key, mixed, session_meta, meta={"person_id": item.person_id})
        cases.append(_make_case(item, item.key, dialogue, positions, ctx, matcher))
    return cases


def _premixed_cases(doc: Any, rel: str, category: str, count: int, ctx: LoadContext,
                    matcher: SpanMatcher) -> list[Case]:
    if not isinstance(doc, list):
        ctx.fail(DataFormatError(f"expected a list of test cases, got {type(doc).__name__}", file=rel,
                                 field="<document>"))
        return []
    base = rel.removesuffix(".json")
    cases = []
    for g, group in enumerate(doc):
        ctx.items += 1
        dialogue_id = f"{base}#{g}"
        try:
            evidence_raw = need(group, "evidenceItems", list, file=rel, item=g)
            convs_raw = need(group, "conversations", list, file=rel, item=g)
            context_size = need(group, "contextSize", int, file=rel, item=g, optional=True)
            conversations = [parse_conversation(c, dialogue_id, rel, g, f"conversations[{j}]", ctx)
                             for j, c in enumerate(convs_raw)]
            if not conversations:
                raise DataFormatError("a test case needs at least one conversation", file=rel, item=g,
                                      field="conversations")
            items = [_parse_item(e, f"{dialogue_id}/{j}", rel, g, category, count, None,
                                 conv_key="conversations", ctx=ctx, where=f"evidenceItems[{j}]",
                                 require_conversations=False)
                     for j, e in enumerate(evidence_raw)]
        except DataFormatError as exc:
            ctx.fail(exc)
            continue
        dialogue = to_dialogue(dialogue_id, conversations, meta={"context_size": context_size})
        for j, item in enumerate(items):
            own = {c.id for c in item.conversations if c.id}
            positions = [p for p, c in enumerate(conversations) if c.id and c.id in own]
            if not positions:  # no ids to go by: the conversations the file flags as evidence
                positions = [p for p, c in enumerate(conversations) if c.meta.get("contains_evidence")]
            item.source.update({"form": "pre_mixed", "evidence_item": j, "context_size": context_size})
            cases.append(_make_case(item, item.key, dialogue, positions, ctx, matcher))
    return cases


def _make_case(item: _Item, case_id: str, dialogue: Dialogue, positions: list[int], ctx: LoadContext,
               matcher: SpanMatcher) -> Case:
    """Map the item's evidence spans inside its evidence sessions (the whole history if unknown)."""
    sessions = [dialogue.sessions[p] for p in positions] or dialogue.sessions
    candidates = [t for s in sessions for t in s.turns]
    evidence_ids: list[str] = []
    outcomes = []
    for role, span in item.spans:
        match = matcher.match(span, candidates, role)
        outcomes.append(match.outcome)
        ctx.evidence.add(match.outcome, f"{case_id}: {span[:100]}")
        if match.turn_id is not None and match.turn_id not in evidence_ids:
            evidence_ids.append(match.turn_id)
    qa = QA(id=f"{case_id}#q0", question=item.question, answer=item.answer, category=item.category,
            evidence_turn_ids=evidence_ids,
            meta={**item.meta, "evidence_texts": [s for _, s in item.spans], "evidence_outcomes": outcomes})
    source = {**item.source, "evidence_session_ids": [dialogue.sessions[p].id for p in positions],
              "evidence_session_positions": list(positions),
              "distractor_sessions": len(dialogue.sessions) - len(positions)}
    return Case(id=case_id, dialogue=dialogue, qas=[qa], source=source)
