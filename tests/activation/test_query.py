from __future__ import annotations

from datetime import date

import pytest

from qgmem.activation.query import HeuristicQueryParser, LLMQueryParser, QueryConstraints, make_parser
from qgmem.timeexpr import parse_fact_time, resolve_time


@pytest.mark.parametrize(
    ("question", "qtime", "entities", "locations", "start", "end"),
    [
        ("What did Caroline do last week?", "2023-05-08T13:56:00", ["Caroline"], [], "2023-05-01", "2023-05-07"),
        ("Did Caroline visit Paris in June 2023?", None, ["Caroline"], ["Paris"], "2023-06-01", "2023-06-30"),
        ("Where did Jon go two days before 8 May 2023?", None, ["Jon"], [], "2023-05-06", "2023-05-06"),
        ("What book did John read 2 weeks ago in New York City?", "2023-06-01", ["John"], ["New York City"],
         "2023-05-15", "2023-05-21"),
        ("Do I have a call with DataWeave Inc. this week?", "2024-03-06", ["DataWeave Inc"], [],
         "2024-03-04", "2024-03-10"),
        ("What happened yesterday at the \"Blue Note\"?", "2023-01-01", ["Blue Note"], [], "2022-12-31", "2022-12-31"),
        ("What's my favorite restaurant?", None, [], [], None, None),
        ("When did Melanie paint a sunrise?", "2023-05-08", ["Melanie"], [], None, None),
    ],
)
def test_heuristic_parser(question, qtime, entities, locations, start, end):
    c = HeuristicQueryParser().parse(question, qtime)
    assert c.entities == entities
    assert c.locations == locations
    assert (c.time_start, c.time_end) == (start, end)


def test_relative_time_needs_question_time():
    span, unresolved = resolve_time("What did she cook last week?", None)
    assert span is None and unresolved == "last week"
    span, unresolved = resolve_time("What did she cook last week?", "2023-05-10")
    assert (span.start, span.end) == (date(2023, 5, 1), date(2023, 5, 7)) and unresolved == ""


def test_event_anchored_shift_stays_unresolved():
    c = HeuristicQueryParser().parse("What did Gina buy two days before the party?", "2023-05-08")
    assert not c.has_time
    assert c.unresolved_time == "two days before the party"


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("2023-05-01", (date(2023, 5, 1), date(2023, 5, 1))),
        ("2023-05", (date(2023, 5, 1), date(2023, 5, 31))),
        ("2022", (date(2022, 1, 1), date(2022, 12, 31))),
        ("2023-05-01/2023-05-07", (date(2023, 5, 1), date(2023, 5, 7))),
        ("", None),
        ("sometime", None),
    ],
)
def test_parse_fact_time(value, expected):
    assert parse_fact_time(value) == expected


def test_llm_parser_reads_fenced_json_and_resolves_interval():
    replies = ['<think>hmm</think>```json\n{"entities": ["Jon"], "locations": ["Paris"], '
               '"time": {"start": "2023-05", "end": "2023-05"}}\n```']
    parser = LLMQueryParser(lambda prompt: replies[0])
    c = parser.parse("What did Jon do in Paris in May 2023?", None)
    assert c == QueryConstraints(entities=["Jon"], locations=["Paris"], time_start="2023-05-01",
                                 time_end="2023-05-31", time_text="llm")
    assert parser.fallbacks == 0


@pytest.mark.parametrize("reply", ["no json here", '{"entities": "Jon"}', '{"time": {"start": "soon"}}'])
def test_llm_parser_falls_back_and_counts(reply):
    parser = LLMQueryParser(lambda prompt: reply)
    c = parser.parse("What did Caroline do last week?", "2023-05-08")
    assert c.entities == ["Caroline"] and c.time_start == "2023-05-01"  # the heuristic answer
    assert parser.fallbacks == 1 and len(parser.errors) == 1


def test_make_parser_adapts_chat_backend():
    class Result:
        def __init__(self, text, error=None):
            self.text, self.error = text, error

    class Backend:
        def __init__(self, result):
            self.result, self.seen = result, []

        def chat(self, conversations, max_new_tokens=512, temperature=0.0):
            self.seen.append((conversations, temperature))
            return [self.result]

    ok = Backend(Result('{"entities": ["Gina"], "locations": [], "time": null}'))
    assert make_parser("llm", ok).parse("Who is Gina?").entities == ["Gina"]
    assert ok.seen[0][1] == 0.0 and ok.seen[0][0][0][0]["role"] == "user"
    failing = make_parser("llm", Backend(Result("", error="timeout")))
    assert failing.parse("Who is Gina?").entities == ["Gina"] and failing.fallbacks == 1
    with pytest.raises(ValueError, match="needs an LLM backend"):
        make_parser("llm")
