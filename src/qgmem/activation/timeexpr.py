"""Time expressions in questions, resolved to closed date intervals.

Fact time is what a time constraint in a question refers to ("what did she do last week?" asks about
facts that *happened* last week), so expressions are resolved to an interval of fact dates. Relative
expressions need the question time; without it they stay unresolved and constrain nothing.
"""

from __future__ import annotations

import calendar
import re
from dataclasses import dataclass
from datetime import date, datetime, timedelta

MONTHS = {name.lower(): i for i, name in enumerate(calendar.month_name) if name}
MONTHS.update({name.lower(): i for i, name in enumerate(calendar.month_abbr) if name})
WEEKDAYS = {name.lower(): i for i, name in enumerate(calendar.day_name)}
NUMBER_WORDS = {"a": 1, "an": 1, "one": 1, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6,
                "seven": 7, "eight": 8, "nine": 9, "ten": 10, "couple of": 2, "few": 3}
UNIT_DAYS = {"day": 1, "week": 7, "month": 30, "year": 365}

_MONTH_RE = r"(?:jan(?:uary)?|feb(?:ruary)?|mar(?:ch)?|apr(?:il)?|may|june?|july?|aug(?:ust)?|sep(?:t(?:ember)?)?|oct(?:ober)?|nov(?:ember)?|dec(?:ember)?)"
_NUM_RE = r"(\d+|a|an|one|two|three|four|five|six|seven|eight|nine|ten|couple of|few)"
_UNIT_RE = r"(day|week|month|year)s?"

ISO_DATE = re.compile(r"\b(\d{4})-(\d{2})-(\d{2})\b")
DAY_MONTH_YEAR = re.compile(rf"\b(\d{{1,2}})(?:st|nd|rd|th)?\s+({_MONTH_RE})\.?,?\s+(\d{{4}})\b", re.I)
MONTH_DAY_YEAR = re.compile(rf"\b({_MONTH_RE})\.?\s+(\d{{1,2}})(?:st|nd|rd|th)?,?\s+(\d{{4}})\b", re.I)
MONTH_YEAR = re.compile(rf"\b({_MONTH_RE})\.?,?\s+(?:of\s+)?(\d{{4}})\b", re.I)
YEAR = re.compile(r"\b(?:in|during|of|since)\s+((?:19|20)\d{2})\b", re.I)
AGO = re.compile(rf"\b{_NUM_RE}\s+{_UNIT_RE}\s+ago\b", re.I)
SHIFT = re.compile(rf"\b{_NUM_RE}\s+{_UNIT_RE}\s+(before|after)\s+(.+?)(?:[?.!,;]|$)", re.I)
LAST_WEEKDAY = re.compile(r"\b(last|this past|on)\s+(monday|tuesday|wednesday|thursday|friday|saturday|sunday)\b", re.I)
SIMPLE_RELATIVE = re.compile(
    r"\b(yesterday|today|tonight|this morning|last night|the day before yesterday|last weekend|this weekend|"
    r"last week|this week|past week|last month|this month|past month|last year|this year|past year|"
    r"next week|next month|recently|earlier today)\b",
    re.I,
)


@dataclass(frozen=True)
class TimeSpan:
    """A closed interval of dates plus the words it came from."""

    start: date
    end: date
    text: str

    def iso(self) -> str:
        return self.start.isoformat() if self.start == self.end else f"{self.start.isoformat()}/{self.end.isoformat()}"


def parse_iso_date(value: str | None) -> date | None:
    """The date part of an ISO-8601 date or datetime string; ``None`` when absent or unparseable."""
    if not value:
        return None
    value = value.strip()
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00")).date()
    except ValueError:
        pass
    m = re.match(r"^(\d{4})(?:-(\d{2}))?(?:-(\d{2}))?", value)
    if not m:
        return None
    try:
        return date(int(m.group(1)), int(m.group(2) or 1), int(m.group(3) or 1))
    except ValueError:
        return None


def parse_fact_time(value: str | None) -> tuple[date, date] | None:
    """A unit's ``fact_time`` (``YYYY-MM-DD``, ``YYYY-MM``, ``YYYY`` or ``a/b`` interval) as a date interval."""
    if not value or not value.strip():
        return None
    parts = value.strip().split("/")
    spans = [_granular_span(p.strip()) for p in parts[:2]]
    if any(s is None for s in spans):
        return None
    return spans[0][0], spans[-1][1]  # type: ignore[index]


def _granular_span(value: str) -> tuple[date, date] | None:
    m = re.match(r"^(\d{4})(?:-(\d{2}))?(?:-(\d{2}))?", value)
    if not m:
        return None
    year = int(m.group(1))
    try:
        if m.group(3):
            d = date(year, int(m.group(2)), int(m.group(3)))
            return d, d
        if m.group(2):
            return _month_span(year, int(m.group(2)))
        return date(year, 1, 1), date(year, 12, 31)
    except ValueError:
        return None


def _month_span(year: int, month: int) -> tuple[date, date]:
    return date(year, month, 1), date(year, month, calendar.monthrange(year, month)[1])


def _month(name: str) -> int:
    name = name.lower().rstrip(".")
    return MONTHS.get(name) or MONTHS[name[:3]]


def _number(word: str) -> int:
    word = word.lower()
    return int(word) if word.isdigit() else NUMBER_WORDS[word]


def _absolute(text: str) -> TimeSpan | None:
    """The first absolute date expression in ``text`` (no reference time needed)."""
    if m := ISO_DATE.search(text):
        try:
            d = date(int(m.group(1)), int(m.group(2)), int(m.group(3)))
            return TimeSpan(d, d, m.group(0))
        except ValueError:
            pass
    for pattern, order in ((DAY_MONTH_YEAR, "dmy"), (MONTH_DAY_YEAR, "mdy")):
        if m := pattern.search(text):
            day, mon, year = (m.group(1), m.group(2), m.group(3)) if order == "dmy" else (m.group(2), m.group(1), m.group(3))
            try:
                d = date(int(year), _month(mon), int(day))
                return TimeSpan(d, d, m.group(0))
            except (ValueError, KeyError):
                pass
    if m := MONTH_YEAR.search(text):
        s, e = _month_span(int(m.group(2)), _month(m.group(1)))
        return TimeSpan(s, e, m.group(0))
    if m := YEAR.search(text):
        year = int(m.group(1))
        return TimeSpan(date(year, 1, 1), date(year, 12, 31), m.group(0))
    return None


def _relative(text: str, ref: date) -> TimeSpan | None:
    """The first relative expression in ``text`` resolved against the reference date ``ref``."""
    if m := AGO.search(text):
        n, unit = _number(m.group(1)), m.group(2).lower()
        center = ref - timedelta(days=n * UNIT_DAYS[unit])
        slack = {"day": 0, "week": 3, "month": 15, "year": 182}[unit]
        return TimeSpan(center - timedelta(days=slack), center + timedelta(days=slack), m.group(0))
    if m := LAST_WEEKDAY.search(text):
        target = WEEKDAYS[m.group(2).lower()]
        delta = (ref.weekday() - target) % 7 or 7
        d = ref - timedelta(days=delta)
        return TimeSpan(d, d, m.group(0))
    if m := SIMPLE_RELATIVE.search(text):
        word = m.group(1).lower()
        week_start = ref - timedelta(days=ref.weekday())
        if word in ("today", "tonight", "this morning", "earlier today"):
            s = e = ref
        elif word in ("yesterday", "last night"):
            s = e = ref - timedelta(days=1)
        elif word == "the day before yesterday":
            s = e = ref - timedelta(days=2)
        elif word == "last weekend":
            s = week_start - timedelta(days=2)
            e = week_start - timedelta(days=1)
        elif word == "this weekend":
            s, e = week_start + timedelta(days=5), week_start + timedelta(days=6)
        elif word == "last week":
            s, e = week_start - timedelta(days=7), week_start - timedelta(days=1)
        elif word == "this week":
            s, e = week_start, week_start + timedelta(days=6)
        elif word == "past week":
            s, e = ref - timedelta(days=7), ref
        elif word == "next week":
            s, e = week_start + timedelta(days=7), week_start + timedelta(days=13)
        elif word == "last month":
            prev = ref.replace(day=1) - timedelta(days=1)
            s, e = _month_span(prev.year, prev.month)
        elif word == "this month":
            s, e = _month_span(ref.year, ref.month)
        elif word == "past month":
            s, e = ref - timedelta(days=30), ref
        elif word == "next month":
            nxt = ref.replace(day=28) + timedelta(days=4)
            s, e = _month_span(nxt.year, nxt.month)
        elif word == "last year":
            s, e = date(ref.year - 1, 1, 1), date(ref.year - 1, 12, 31)
        elif word == "this year":
            s, e = date(ref.year, 1, 1), date(ref.year, 12, 31)
        elif word == "past year":
            s, e = ref - timedelta(days=365), ref
        else:  # "recently"
            s, e = ref - timedelta(days=30), ref
        return TimeSpan(s, e, m.group(0))
    return None


def resolve_time(text: str, question_time: str | None) -> tuple[TimeSpan | None, str]:
    """The time constraint of a question and any time expression left unresolved.

    "two days before 8 May 2023" shifts the absolute date; "two days before the party" names an
    event rather than a date, so it is returned as unresolved text (the event itself is still matched
    by the lexical and semantic channels).
    """
    ref = parse_iso_date(question_time)
    if m := SHIFT.search(text):
        n, unit, direction, anchor_text = _number(m.group(1)), m.group(2).lower(), m.group(3).lower(), m.group(4)
        anchor = _absolute(anchor_text) or (_relative(anchor_text, ref) if ref else None)
        if anchor is None:
            return None, m.group(0).rstrip("?.!,; ")
        shift = timedelta(days=n * UNIT_DAYS[unit])
        s, e = (anchor.start - shift, anchor.end - shift) if direction == "before" else (anchor.start + shift, anchor.end + shift)
        return TimeSpan(s, e, m.group(0).rstrip("?.!,; ")), ""
    if span := _absolute(text):
        return span, ""
    relative_hit = AGO.search(text) or LAST_WEEKDAY.search(text) or SIMPLE_RELATIVE.search(text)
    if relative_hit is None:
        return None, ""
    if ref is None:
        return None, relative_hit.group(0)
    return _relative(text, ref), ""
