from __future__ import annotations

import pytest

from qgmem.memory.dates import find_fact_time, normalize_fact_time

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
