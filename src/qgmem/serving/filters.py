"""Which of a user's units a search or a memories listing may hold: a time window on the fact time or
the utterance time, and a set of sessions. The filter picks the units before anything is ranked, so
the top k of a filtered search are the best matching units, not the matching few of the global top k.

A unit's time is a span: an utterance time or a date-time is a point, a date (``2024-05-01``) is that
whole day and a fact-time interval (``2024-05-01/2024-05-07``) runs from its first day to the end of its
last. A unit is kept when its span meets ``[after, before)``; a unit without the chosen time is not
kept once a time bound is given (it cannot be placed in the window).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from qgmem.timeexpr import parse_iso_date, parse_time

#: the times a unit can be filtered on (``time_field``); the first is the default
TIME_FIELDS = ("utterance", "fact")


@dataclass(frozen=True)
class Filters:
    after: datetime | None = None
    before: datetime | None = None
    time_field: str = TIME_FIELDS[0]
    sessions: frozenset[str] | None = None

    def __bool__(self) -> bool:
        return self.after is not None or self.before is not None or self.sessions is not None

    def keeps(self, unit) -> bool:
        if self.sessions is not None and unit.session_id not in self.sessions:
            return False
        if self.after is None and self.before is None:
            return True
        span = unit_span(unit.fact_time if self.time_field == "fact" else unit.utterance_time)
        if span is None:
            return False
        start, end = span
        return (self.after is None or end > self.after or start >= self.after) and \
            (self.before is None or start < self.before)


def unit_span(value: str | None) -> tuple[datetime, datetime] | None:
    """``(start, end)`` of a unit's time (see the module docstring); ``None`` when it has none."""
    if not value or not value.strip():
        return None
    first, _, last = value.strip().partition("/")
    start, end = _bounds(first), _bounds(last or first)
    if start is None or end is None:
        return None
    return start[0], end[1]


def _bounds(value: str) -> tuple[datetime, datetime] | None:
    if "T" in value or " " in value.strip():  # a date-time: a point
        point = parse_time(value)
        return None if point is None else (point, point)
    day = parse_iso_date(value)
    if day is None:
        return None
    start = datetime(day.year, day.month, day.day)
    return start, start + timedelta(days=1)
