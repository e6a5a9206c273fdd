from __future__ import annotations

import pytest

from qgmem.timeexpr import find_fact_time, normalize_fact_time, parse_fact_time, resolve_time

SAID = "2023-05-08T13:56:00"  # a Monday


@pytest.mark.parametrize("text,expected", [
    ("I moved to Denver yesterday.", "2023-05-07"),
    ("We had the demo 3 days ago.", "2023-05-05"),
    ("I started the job last week.", "2023-05-01/2023-05-07"),
    ("The launch is next month.", "2023-06-01/2023-06-30"),
    ("I quit smoking in 2019.", "2019-01-01/2019-12-31"),
    ("The contract was signed on May 3, 2021.", "2021-05-03"),
    ("We went hiking last weekend.", "2023-05-06/2023-05-07"),
    ("The call is next Tuesday.", "2023-05-09"),
    ("I got the offer in March 2022.", "2022-03-01/2022-03-31"),
    ("I use green for hot leads.", ""),
])
def test_fact_time_is_resolved_against_the_utterance_time(text, expected):
    assert find_fact_time(text, SAID)[0] == expected


@pytest.mark.parametrize("text,expected", [
    ("I moved yesterday.", ""),  # relative, and no utterance time: vague
    ("The contract was signed on May 3, 2021.", "2021-05-03"),  # absolute: still resolvable
])
def test_without_utterance_time_only_absolute_dates_resolve(text, expected):
    assert find_fact_time(text, None)[0] == expected


@pytest.mark.parametrize("value,expected", [
    ("2023-05-01", "2023-05-01"), ("2023-05/2023-06", "2023-05/2023-06"), ("yesterday", "2023-05-07"),
    ("sometime", ""), ("", ""),
])
def test_normalize_llm_fact_time(value, expected):
    assert normalize_fact_time(value, SAID) == expected


# One phrase, one interval: a fact said at SAID and a question asked at SAID resolve it alike, so the
# attribute channel compares like with like (2023-05-08 is a Monday).
SHARED = [
    ("today", "2023-05-08"), ("tonight", "2023-05-08"), ("this morning", "2023-05-08"),
    ("yesterday", "2023-05-07"), ("last night", "2023-05-07"), ("the day before yesterday", "2023-05-06"),
    ("tomorrow", "2023-05-09"),
    ("this week", "2023-05-08/2023-05-14"), ("last week", "2023-05-01/2023-05-07"),
    ("next week", "2023-05-15/2023-05-21"), ("past week", "2023-05-01/2023-05-08"),
    ("the past week", "2023-05-01/2023-05-08"),
    ("this weekend", "2023-05-13/2023-05-14"), ("last weekend", "2023-05-06/2023-05-07"),
    ("next weekend", "2023-05-20/2023-05-21"),
    ("this month", "2023-05-01/2023-05-31"), ("last month", "2023-04-01/2023-04-30"),
    ("next month", "2023-06-01/2023-06-30"), ("past month", "2023-04-08/2023-05-08"),
    ("this year", "2023-01-01/2023-12-31"), ("last year", "2022-01-01/2022-12-31"),
    ("past year", "2022-05-08/2023-05-08"), ("recently", "2023-04-08/2023-05-08"),
    ("3 days ago", "2023-05-05"), ("two weeks ago", "2023-04-21/2023-04-27"),
    ("a month ago", "2023-03-24/2023-04-23"),
    ("last Friday", "2023-05-05"), ("this past Friday", "2023-05-05"), ("on Friday", "2023-05-05"),
    ("last Monday", "2023-05-01"), ("this Wednesday", "2023-05-10"), ("next Tuesday", "2023-05-09"),
    ("on May 3, 2021", "2021-05-03"), ("on 3rd May 2021", "2021-05-03"), ("on 2021-05-03", "2021-05-03"),
    ("on 5/3/2021", "2021-05-03"), ("on May 3", "2023-05-03"), ("in March 2022", "2022-03-01/2022-03-31"),
    ("in 2019", "2019-01-01/2019-12-31"),
]


@pytest.mark.parametrize("phrase,expected", SHARED)
def test_a_phrase_means_one_interval_for_facts_and_questions(phrase, expected):
    fact_time, found = find_fact_time(f"I went to the dentist {phrase}.", SAID)
    span, unresolved = resolve_time(f"Where did I go {phrase}?", SAID)
    assert fact_time == expected and found and found.lower() in phrase.lower()
    assert span is not None and span.iso() == expected and unresolved == ""
    assert parse_fact_time(fact_time) == (span.start, span.end)


@pytest.mark.parametrize("phrase", [phrase for phrase, _ in SHARED if not any(c.isdigit() for c in phrase)
                                    or "ago" in phrase])
def test_relative_phrases_are_vague_without_a_reference_time(phrase):
    fact_time, found = find_fact_time(f"I went to the dentist {phrase}.", None)
    assert fact_time == "" and found
    span, unresolved = resolve_time(f"Where did I go {phrase}?", None)
    assert span is None and unresolved


def test_a_shift_from_an_absolute_anchor_and_from_an_event():
    span, unresolved = resolve_time("Where did Jon go two days before 8 May 2023?", None)
    assert span.iso() == "2023-05-06" and unresolved == ""
    assert resolve_time("What did Gina buy two days before the party?", SAID) == (None, "two days before the party")


def test_a_time_with_an_offset_is_its_instant_and_one_without_is_read_as_utc():
    from datetime import datetime

    from qgmem.timeexpr import parse_time

    same = {parse_time(t) for t in ("2024-05-02T00:00:00Z", "2024-05-02T05:00:00+05:00",
                                    "2024-05-01T19:00:00-05:00", "2024-05-02T00:00:00", "2024-05-02")}
    assert same == {datetime(2024, 5, 2)}
    assert parse_time("2024-05-02T04:30:00+00:00") < parse_time("2024-05-02T10:00:00+05:00")  # 04:30Z < 05:00Z


def test_a_calendar_phrase_resolves_on_the_speakers_own_date():
    from qgmem.timeexpr import parse_iso_date

    assert str(parse_iso_date("2024-05-02T23:00:00-05:00")) == "2024-05-02"  # UTC's date is 3 May
    assert resolve_time("yesterday", "2024-05-02T23:00:00-05:00")[0].iso() == "2024-05-01"
