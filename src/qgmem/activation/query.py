"""Query parsing: the entity, location and fact-time constraints the event-attribute channel matches.

Two parsers behind one call, ``parse(question, question_time) -> QueryConstraints``: a heuristic one
(capitalization and preposition patterns, rule-based time expressions; the embedded default, no LLM)
and an LLM one that follows the paper's query-parsing prompt through any chat backend.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Callable, Protocol

from qgmem.llm.parsing import extract_json
from qgmem.timeexpr import MONTHS, WEEKDAYS, parse_fact_time, resolve_time


@dataclass
class QueryConstraints:
    """What a question constrains: entities, locations and a fact-time interval (ISO dates, inclusive)."""

    entities: list[str] = field(default_factory=list)
    locations: list[str] = field(default_factory=list)
    time_start: str | None = None
    time_end: str | None = None
    time_text: str = ""  # the words the interval came from
    unresolved_time: str = ""  # a time expression that could not be turned into dates

    @property
    def has_time(self) -> bool:
        return self.time_start is not None and self.time_end is not None

    def is_empty(self) -> bool:
        return not (self.entities or self.locations or self.has_time)


class QueryParser(Protocol):
    def parse(self, question: str, question_time: str | None = None) -> QueryConstraints: ...


# Capitalized words that start questions or sentences without naming anything.
_NOT_NAMES = {
    "what", "when", "where", "who", "whom", "whose", "which", "why", "how", "did", "do", "does", "is", "are",
    "was", "were", "has", "have", "had", "can", "could", "would", "should", "will", "shall", "may", "might",
    "i", "i'm", "i've", "i'd", "i'll", "my", "me", "we", "our", "you", "your", "he", "she", "his", "her", "they",
    "their", "it", "its", "the", "a", "an", "and", "or", "but", "so", "if", "in", "on", "at", "to", "for", "of",
    "just", "quick", "hey", "hi", "hello", "remind", "tell", "based", "given", "according", "also", "any",
    "yes", "no", "ok", "okay", "please", "thanks", "there", "this", "that", "these", "those", "after", "before",
    "since", "during", "last", "next", "mr", "mrs", "ms", "dr",
} | set(MONTHS) | set(WEEKDAYS)
_NAME_SEQ = re.compile(r"\b[A-Z][\w&'.-]*(?:\s+(?:of|de|la|van|von|the|&)?\s*[A-Z][\w&'.-]*)*")
_QUOTED = re.compile(r"[\"“]([^\"”]{2,60})[\"”]")
_LOCATION = re.compile(
    r"\b(?:in|at|to|from|near|around|visit(?:ed|ing)?|moved to|live[sd]? in|trip to)\s+(?:the\s+)?"
    r"([A-Z][\w'.-]*(?:\s+[A-Z][\w'.-]*)*)"
)


def _clean_name(name: str) -> str:
    name = re.sub(r"'s$|’s$", "", name.strip(" .,;:!?'\""))
    return name.strip()


class HeuristicQueryParser:
    """Entities from capitalized spans and quotes, locations from preposition patterns, rule-based times."""

    def parse(self, question: str, question_time: str | None = None) -> QueryConstraints:
        span, unresolved = resolve_time(question, question_time)
        time_words = set(span.text.lower().split()) if span else set()
        locations: list[str] = []
        for m in _LOCATION.finditer(question):
            name = self._strip_leading(_clean_name(m.group(1)))
            if name and name.lower() not in _NOT_NAMES and name.lower() not in time_words:
                locations.append(name)
        entities: list[str] = [_clean_name(q) for q in _QUOTED.findall(question)]
        for m in _NAME_SEQ.finditer(question):
            name = self._strip_leading(_clean_name(m.group(0)))
            if not name or name.lower() in _NOT_NAMES or name in locations:
                continue
            if all(w.lower() in time_words or w.lower() in _NOT_NAMES for w in name.split()):
                continue
            entities.append(name)
        return QueryConstraints(
            entities=list(dict.fromkeys(e for e in entities if e)),
            locations=list(dict.fromkeys(locations)),
            time_start=span.start.isoformat() if span else None,
            time_end=span.end.isoformat() if span else None,
            time_text=span.text if span else "",
            unresolved_time=unresolved,
        )

    @staticmethod
    def _strip_leading(name: str) -> str:
        """Drop question words glued to the front of a capitalized span ("Did Caroline" -> "Caroline")."""
        words = name.split()
        while words and words[0].lower() in _NOT_NAMES:
            words = words[1:]
        return " ".join(words)


QUERY_PROMPT = """You extract search constraints from a question about a long conversation history.
Return one JSON object and nothing else, with keys:
  "entities": short, discriminative names of people, organizations, objects or events the question is about (not the speaker "I"),
  "locations": places the question restricts to,
  "time": {{"start": "YYYY-MM-DD", "end": "YYYY-MM-DD"}} when the question restricts WHEN THE FACT HAPPENED, else null.
Resolve relative expressions ("last week", "two days ago") against the question time. Do not confuse the time
the question is asked with the time of the fact; leave time null when it is vague or is what the question asks for.
Question time: {question_time}
Question: {question}
JSON:"""


class LLMQueryParser:
    """The paper's query parsing through a chat backend; falls back to the heuristic parser on bad output.

    ``complete`` is any callable taking a prompt and returning the reply text (wrap the shared LLM
    backend's call in it; temperature 0 there). Each fallback is counted in ``fallbacks``.
    """

    def __init__(self, complete: Callable[[str], str], fallback: QueryParser | None = None):
        self.complete = complete
        self.fallback = fallback or HeuristicQueryParser()
        self.fallbacks = 0
        self.errors: list[str] = []

    def parse(self, question: str, question_time: str | None = None) -> QueryConstraints:
        try:
            reply = self.complete(QUERY_PROMPT.format(question=question, question_time=question_time or "unknown"))
            return self._from_json(extract_json(reply))
        except (ValueError, TypeError, KeyError) as exc:
            self.fallbacks += 1
            self.errors.append(f"query {question[:60]!r}: {exc}")
            return self.fallback.parse(question, question_time)

    @staticmethod
    def _from_json(data: dict[str, Any]) -> QueryConstraints:
        def names(key: str) -> list[str]:
            value = data.get(key) or []
            if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
                raise TypeError(f"field {key!r} must be a list of strings, got {value!r}")
            return [v.strip() for v in value if v.strip()]

        time = data.get("time")
        start = end = None
        if time:
            if not isinstance(time, dict):
                raise TypeError(f"field 'time' must be an object or null, got {time!r}")
            start_span = parse_fact_time(time.get("start"))
            end_span = parse_fact_time(time.get("end") or time.get("start"))
            if start_span is None or end_span is None:
                raise ValueError(f"field 'time' has no ISO dates: {time!r}")
            start, end = start_span[0].isoformat(), end_span[1].isoformat()
        return QueryConstraints(entities=names("entities"), locations=names("locations"),
                                time_start=start, time_end=end, time_text="llm" if start else "")


def backend_completer(llm: Any) -> Callable[[str], str]:
    """A prompt -> text callable from the shared backend (``chat(conversations) -> [ChatResult]``),
    an object with ``complete(prompt)``, or a plain callable. Failed requests raise ``ValueError`` so
    the LLM parser falls back (and counts it)."""
    if hasattr(llm, "chat"):
        def complete(prompt: str) -> str:
            result = llm.chat([[{"role": "user", "content": prompt}]], max_new_tokens=256, temperature=0.0)[0]
            if getattr(result, "error", None):
                raise ValueError(f"LLM request failed: {result.error}")
            return result.text
        return complete
    if hasattr(llm, "complete"):
        return llm.complete
    if callable(llm):
        return llm
    raise TypeError(f"llm must be a chat backend, have .complete(prompt), or be callable; got {type(llm).__name__}")


def make_parser(kind: str, llm: Any = None) -> QueryParser:
    """``heuristic``, or ``llm`` (needs ``llm``: the shared chat backend or a prompt -> text callable)."""
    if kind == "heuristic":
        return HeuristicQueryParser()
    if kind == "llm":
        if llm is None:
            raise ValueError("parser='llm' needs an LLM backend (pass llm=...)")
        return LLMQueryParser(backend_completer(llm))
    raise ValueError(f"unknown parser {kind!r}")

