"""The filters' time rule: a unit's time as a span (point, day, interval) meeting ``[after, before)``."""

from __future__ import annotations

from datetime import datetime
from types import SimpleNamespace

import pytest

from qgmem.serving.filters import Filters, unit_span


def _unit(fact_time: str = "", utterance_time: str | None = None, session_id: str = "s0"):
    return SimpleNamespace(fact_time=fact_time, utterance_time=utterance_time, session_id=session_id)


def test_spans_of_points_days_and_intervals():
    assert unit_span("2024-05-01T10:30:00") == (datetime(2024, 5, 1, 10, 30), datetime(2024, 5, 1, 10, 30))
    assert unit_span("2024-05-01") == (datetime(2024, 5, 1), datetime(2024, 5, 2))
    assert unit_span("2024-05-01/2024-05-07") == (datetime(2024, 5, 1), datetime(2024, 5, 8))
    assert unit_span("") is None and unit_span(None) is None and unit_span("last spring") is None


@pytest.mark.parametrize("after,before,kept", [
    (datetime(2024, 5, 3), None, ["interval"]),  # the interval runs past the 3rd; the day and the point do not
    (datetime(2024, 5, 1, 12), None, ["day", "interval"]),
    (None, datetime(2024, 5, 1, 10, 30), ["day", "interval"]),  # before is exclusive: the 10:30 point is out
    (datetime(2024, 4, 1), datetime(2024, 4, 30), []),
    (None, None, ["point", "day", "interval", "none"]),
])
def test_a_unit_is_kept_when_its_span_meets_the_window(after, before, kept):
    units = {"point": _unit(utterance_time="2024-05-01T10:30:00", fact_time="2024-05-01T10:30:00"),
             "day": _unit(fact_time="2024-05-01", utterance_time="2024-05-01"),
             "interval": _unit(fact_time="2024-05-01/2024-05-07", utterance_time="2024-05-01/2024-05-07"),
             "none": _unit()}
    for field in ("fact", "utterance"):
        filters = Filters(after, before, field)
        assert [name for name, u in units.items() if filters.keeps(u)] == kept, field


def test_sessions_and_time_together():
    filters = Filters(after=datetime(2024, 1, 1), sessions=frozenset({"s1"}))
    assert filters.keeps(_unit(utterance_time="2024-02-01", session_id="s1"))
    assert not filters.keeps(_unit(utterance_time="2024-02-01", session_id="s0"))
    assert not filters.keeps(_unit(utterance_time="2023-02-01", session_id="s1"))
    assert not Filters() and Filters(sessions=frozenset({"s0"}))


def test_times_with_offsets_compare_as_instants():
    """Was: the offset dropped, so the same instant written two ways kept different units, a unit said at
    04:30Z was outside 04:00Z–05:00Z when written with +05:00, and a valid window with two offsets was
    refused as "before must be later than after"."""
    from qgmem.serving.requests import check_filters

    said = _unit(utterance_time="2024-05-02T04:30:00Z")
    zulu = check_filters({"after": "2024-05-02T04:00:00Z", "before": "2024-05-02T05:00:00Z"})
    offsets = check_filters({"after": "2024-05-02T09:00:00+05:00", "before": "2024-05-01T23:00:00-06:00"})
    assert zulu == offsets and zulu.keeps(said) and offsets.keeps(said)
    assert not check_filters({"after": "2024-05-02T09:31:00+05:00"}).keeps(said)
    window = check_filters({"after": "2024-05-02T10:00:00+05:00", "before": "2024-05-02T09:00:00-05:00"})
    assert window.after == datetime(2024, 5, 2, 5) and window.before == datetime(2024, 5, 2, 14)
    assert Filters(after=datetime(2024, 5, 2)).keeps(_unit(utterance_time="2024-05-02T05:00:00+05:00"))
