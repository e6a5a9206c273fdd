"""The LLM extractor (the paper's method): one prompted JSON reply per window, validated.

All windows of a dialogue go to the backend as one batch (it bounds concurrency or batches generation
itself); the cache build runs several dialogues' extractions at once on threads sharing one server
backend, whose ``max_concurrency`` bounds them all together. A reply that does not validate is asked again once, quoting the error; if that fails too, the
window is skipped and the reason counted. The check runs inside the backend call (``validate=``), so
a reply that does not validate is never stored in the response cache. A backend error (timeout, HTTP failure after the backend's
own retries) skips the window at once. Either way the build goes on: a bad reply costs one window.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from qgmem.llm.base import LLMBackend
from qgmem.llm.parsing import JSONExtractionError, extract_json
from qgmem.llm.prompts import construction_messages, format_turn, retry_messages
from qgmem.memory.config import ConstructionConfig
from qgmem.timeexpr import normalize_fact_time
from qgmem.memory.records import MemoryUnit
from qgmem.memory.windows import Window


class ReplyValidationError(ValueError):
    """A reply that does not match the unit schema; the message names the unit and field."""


@dataclass
class UnitSpec:
    """One unit as the LLM states it, turn bounds still as window-local labels ("T1"…)."""

    fact: str
    turn_start: str
    turn_end: str
    subject: str
    predicate: str
    object: str
    entities: list[str] = field(default_factory=list)
    location: str = ""
    fact_time: str = ""

    @classmethod
    def from_json(cls, item: Any, where: str) -> UnitSpec:
        if not isinstance(item, dict):
            raise ReplyValidationError(f"{where}: expected an object, got {type(item).__name__}")

        def text(name: str, required: bool = True) -> str:
            value = item.get(name, "")
            if value is None:
                value = ""
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                value = str(value)
            if not isinstance(value, str):
                raise ReplyValidationError(f"{where}.{name}: expected a string, got {type(value).__name__}")
            if required and not value.strip():
                raise ReplyValidationError(f"{where}.{name}: must be a non-empty string")
            return value.strip()

        entities = item.get("entities", [])
        if isinstance(entities, str):
            entities = [entities] if entities.strip() else []
        if not isinstance(entities, list) or not all(isinstance(e, str) for e in entities):
            raise ReplyValidationError(f"{where}.entities: expected a list of strings")
        start = text("turn_start")
        return cls(fact=text("fact"), turn_start=start, turn_end=text("turn_end", required=False) or start,
                   subject=text("subject"), predicate=text("predicate"), object=text("object"),
                   entities=[e.strip() for e in entities if e.strip()], location=text("location", False),
                   fact_time=text("fact_time", False))


def parse_reply(reply: str) -> list[UnitSpec]:
    """Decode and validate a construction reply; raises with a message fit to quote in a retry."""
    try:
        data = extract_json(reply, expect=dict)
    except JSONExtractionError as e:
        data, error = None, str(e)
    if data is None or "units" not in data:
        try:  # some models answer with the bare list of units (the dict found was its first item)
            data = {"units": extract_json(reply, expect=list)}
        except JSONExtractionError:
            if data is None:
                raise ReplyValidationError(error) from None
    units = data.get("units")
    if not isinstance(units, list):
        raise ReplyValidationError('the object must have a "units" list')
    return [UnitSpec.from_json(item, f"units[{i}]") for i, item in enumerate(units)]


@dataclass
class WindowOutcome:
    """What one window produced: its units, or why it was skipped; and what it cost."""

    units: list[MemoryUnit] = field(default_factory=list)
    skipped: str | None = None
    unavailable: bool = False  # skipped because no reply came at all (the server was unreachable)
    retried: bool = False
    overlap_only: int = 0  # units dropped because they cited only context turns


@dataclass
class ExtractionReport:
    outcomes: list[WindowOutcome]
    skip_reasons: Counter = field(default_factory=Counter)


def _label(i: int) -> str:
    return f"T{i + 1}"


class LLMExtractor:
    """Prompted construction over a backend (see the module docstring for the retry/skip policy)."""

    name = "llm"

    def __init__(self, backend: LLMBackend, config: ConstructionConfig | None = None):
        self.backend = backend
        self.config = config or ConstructionConfig(extractor="llm")

    def messages(self, window: Window, session_time: str | None = None) -> list[dict[str, str]]:
        lines = [format_turn(_label(i), t.speaker, t.text, t.time, i < window.overlap)
                 for i, t in enumerate(window.turns)]
        return construction_messages(lines, session_time)

    def to_units(self, specs: list[UnitSpec], window: Window, dialogue_id: str,
                 session_time: str | None) -> tuple[list[MemoryUnit], int]:
        """Map labels back to turns, enforce grounding; raises on unknown or reversed turn labels."""
        labels = {_label(i): i for i in range(len(window.turns))}
        by_id = {t.id: i for i, t in enumerate(window.turns)}
        units, overlap_only = [], 0
        for k, spec in enumerate(specs):
            bounds = []
            for name in ("turn_start", "turn_end"):
                value = getattr(spec, name).strip("[] ")
                position = labels.get(value.upper(), by_id.get(value))
                if position is None:
                    raise ReplyValidationError(f"units[{k}].{name}: {value!r} is not a turn of this slice "
                                               f"(use {', '.join(labels)})")
                bounds.append(position)
            first, last = bounds
            if first > last:
                raise ReplyValidationError(f"units[{k}]: turn_start comes after turn_end")
            if last < window.overlap:  # cites only context turns: grounded elsewhere, not here
                overlap_only += 1
                continue
            turns = window.turns[first:last + 1]
            utterance_time = turns[-1].time or session_time
            units.append(MemoryUnit(
                id=f"{window.id}.u{len(units)}", dialogue_id=dialogue_id, session_id=window.session_id,
                window_id=window.id, fact=spec.fact, subject=spec.subject, predicate=spec.predicate,
                object=spec.object, source_turn_ids=[t.id for t in turns],
                source_text="\n".join(t.text if len(turns) == 1 else f"{t.speaker}: {t.text}" for t in turns),
                speaker=turns[0].speaker, entities=list(dict.fromkeys(spec.entities)), location=spec.location,
                fact_time=normalize_fact_time(spec.fact_time, utterance_time), utterance_time=utterance_time,
                order=turns[0].index,
            ))
        return units, overlap_only

    def _check(self, window: Window, dialogue_id: str, session_times: dict[str, str | None]):
        """The backend-side check of a reply: it must parse and map onto this window's turns.

        A reply that fails it is never cached; it comes back ``unusable`` and is asked again below with
        the validation error quoted.
        """
        return lambda text: self.to_units(parse_reply(text), window, dialogue_id, session_times.get(window.session_id))

    def extract_windows(self, windows: list[Window], dialogue_id: str,
                        session_times: dict[str, str | None] | None = None) -> ExtractionReport:
        session_times = session_times or {}
        outcomes = [WindowOutcome() for _ in windows]
        report = ExtractionReport(outcomes)
        prompts = [self.messages(w, session_times.get(w.session_id)) for w in windows]
        params = {"max_new_tokens": self.config.max_new_tokens, "temperature": self.config.temperature}
        pending = list(range(len(windows)))
        conversations = prompts
        for attempt in range(self.config.llm_retries + 1):
            checks = [self._check(windows[i], dialogue_id, session_times) for i in pending]
            replies = self.backend.chat([conversations[i] for i in pending], **params, validate=checks)
            retry, retry_prompts = [], {}
            for i, reply in zip(pending, replies):
                window = windows[i]
                if reply.error is not None and not reply.unusable:  # the request failed: no reply to fix
                    outcomes[i].skipped = f"llm error: {reply.error[:120]}"
                    report.skip_reasons["llm_error"] += 1
                    # an outage (server unreachable, retries spent) is counted apart: the training cache never
                    # stores a case that lost windows to one (qgmem.samples.build.Replayer.rows)
                    outcomes[i].unavailable = reply.unavailable
                    continue
                try:
                    specs = parse_reply(reply.text)
                    units, dropped = self.to_units(specs, window, dialogue_id, session_times.get(window.session_id))
                except ReplyValidationError as e:
                    if attempt < self.config.llm_retries:
                        retry.append(i)
                        retry_prompts[i] = retry_messages(prompts[i], reply.text, str(e))
                        outcomes[i].retried = True
                    else:
                        outcomes[i].skipped = f"invalid reply after {attempt + 1} attempts: {str(e)[:160]}"
                        report.skip_reasons["invalid_reply"] += 1
                    continue
                outcomes[i].units, outcomes[i].overlap_only = units, dropped
            if not retry:
                break
            pending = retry
            conversations = [retry_prompts.get(i) for i in range(len(windows))]
        return report
