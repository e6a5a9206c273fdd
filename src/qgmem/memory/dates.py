"""Factual time from text: find a date expression and resolve it against the utterance time.

``dateparser`` is accurate but costs ~0.5 ms a call, and most sentences hold no date at all, so a
compiled pattern finds the expression first and only a match is parsed (results memoized). Spans such
as "last week" or "in 2019" become ISO intervals (``start/end``), single days ISO dates. A relative
expression without a known utterance time is vague and gives ``""``, as does anything unparseable.
"""

from __future__ import annotations

import calendar
import re
from datetime import date, datetime, timedelta
from functools import lru_cache

_MONTHS = ("january|february|march|april|may|june|july|august|september|october|november|december|"
           "jan|feb|mar|apr|jun|jul|aug|sep|sept|oct|nov|dec")
_WEEKDAYS = "monday|tuesday|wednesday|thursday|friday|saturday|sunday"
_NUM = r"(?:\d+|a|an|one|two|three|four|five|six|seven|eight|nine|ten|a couple of|a few|several)"

DATE_PATTERN = re.compile(
    r"\b(?:"
    r"(?P<iso>\d{4}-\d{2}-\d{2})"
    r"|(?P<numeric>\d{1,2}/\d{1,2}/\d{2,4})"
    rf"|(?P<md>(?:{_MONTHS})\.?\s+\d{{1,2}}(?:st|nd|rd|th)?(?:,?\s+\d{{4}})?)"
    rf"|(?P<dm>\d{{1,2}}(?:st|nd|rd|th)?\s+(?:of\s+)?(?:{_MONTHS})(?:,?\s+\d{{4}})?)"
    rf"|(?P<my>(?:{_MONTHS})\s+(?:of\s+)?\d{{4}})"
    rf"|(?P<ago>{_NUM}\s+(?:day|week|month|year)s?\s+ago)"
    r"|(?P<span>(?:last|next|this|past)\s+(?:week|month|year|weekend))"
    rf"|(?P<wd>(?:last|next|this)\s+(?:{_WEEKDAYS}))"
    r"|(?P<rel>yesterday|today|tonight|tomorrow|this\s+(?:morning|afternoon|evening))"
    r"|(?P<year>(?:in|since|back in|during)\s+(?:19|20)\d{2})"
    rf"|(?P<bare>(?:on\s+)?(?:{_WEEKDAYS}))"
    r")\b",
    re.IGNORECASE,
)

_WORDS = {"a": 1, "an": 1, "one": 1, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6, "seven": 7,
          "eight": 8, "nine": 9, "ten": 10, "a couple of": 2, "a few": 3, "several": 3}


def parse_time(value: str | None) -> datetime | None:
    """An ISO-8601 utterance time as a naive datetime, or ``None`` when absent or unreadable."""
    if not value:
        return None
    try:
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    return parsed.replace(tzinfo=None)


def _interval(start: date, end: date) -> str:
    return f"{start.isoformat()}/{end.isoformat()}"


def _month_interval(year: int, month: int) -> str:
    return _interval(date(year, month, 1), date(year, month, calendar.monthrange(year, month)[1]))


def _span(kind: str, unit: str, base: date) -> str:
    if unit == "week":
        monday = base - timedelta(days=base.weekday())
        shift = {"last": -7, "past": -7, "next": 7, "this": 0}[kind]
        monday += timedelta(days=shift)
        return _interval(monday, monday + timedelta(days=6))
    if unit == "weekend":
        saturday = base + timedelta(days=(5 - base.weekday()) % 7)
        if kind in ("last", "past") or (kind == "this" and base.weekday() == 6):
            saturday -= timedelta(days=7)
        elif kind == "next" and base.weekday() < 5:
            saturday += timedelta(days=7)
        return _interval(saturday, saturday + timedelta(days=1))
    if unit == "month":
        year, month = base.year, base.month + {"last": -1, "past": -1, "next": 1, "this": 0}[kind]
        if month == 0:
            year, month = year - 1, 12
        elif month == 13:
            year, month = year + 1, 1
        return _month_interval(year, month)
    year = base.year + {"last": -1, "past": -1, "next": 1, "this": 0}[kind]
    return _interval(date(year, 1, 1), date(year, 12, 31))


@lru_cache(maxsize=8192)
def _dateparse(phrase: str, base_iso: str | None, prefer: str) -> str:
    import dateparser

    settings = {"RETURN_AS_TIMEZONE_AWARE": False, "PREFER_DATES_FROM": prefer}
    if base_iso:
        settings["RELATIVE_BASE"] = datetime.fromisoformat(base_iso)
    parsed = dateparser.parse(phrase, languages=["en"], settings=settings)
    return parsed.date().isoformat() if parsed else ""


def resolve_match(match: re.Match, base: datetime | None) -> str:
    """The ISO date/interval for one :data:`DATE_PATTERN` match ("" when vague)."""
    kind = match.lastgroup
    phrase = match.group(0).lower()
    base_iso = base.isoformat() if base else None
    if kind == "iso":
        return phrase
    if kind == "year":
        year = int(phrase[-4:])
        return _interval(date(year, 1, 1), date(year, 12, 31))
    if kind == "my":
        year = int(phrase[-4:])
        parsed = _dateparse(f"1 {phrase.replace(' of ', ' ')}", None, "current_period")
        return _month_interval(year, int(parsed[5:7])) if parsed else ""
    has_year = bool(re.search(r"\d{4}", phrase))
    if kind in ("md", "dm", "numeric"):
        if not has_year and base is None:
            return ""
        return _dateparse(phrase.replace("of ", ""), base_iso, "current_period")
    if base is None:
        return ""
    if kind == "span":
        which, unit = phrase.split()
        return _span(which, unit, base.date())
    if kind == "ago":
        number, unit = re.match(rf"({_NUM})\s+(day|week|month|year)", phrase).groups()
        n = int(number) if number.isdigit() else _WORDS[number]
        days = {"day": 1, "week": 7, "month": 30, "year": 365}[unit] * n
        return (base.date() - timedelta(days=days)).isoformat()
    if kind == "rel":
        offset = {"yesterday": -1, "tomorrow": 1}.get(phrase, 0)
        return (base.date() + timedelta(days=offset)).isoformat()
    if kind == "wd":
        which = phrase.split()[0]
        prefer = "past" if which == "last" else "future"
        return _dateparse(phrase, base_iso, prefer)
    return _dateparse(phrase.removeprefix("on "), base_iso, "current_period")


def find_fact_time(text: str, utterance_time: str | None) -> tuple[str, str]:
    """``(iso, phrase)`` for the first date expression in ``text``; ``("", "")`` when there is none."""
    match = DATE_PATTERN.search(text)
    if match is None:
        return "", ""
    return resolve_match(match, parse_time(utterance_time)), match.group(0)


_ISO_PART = r"\d{4}(?:-\d{2}(?:-\d{2})?)?"
ISO_FACT_TIME = re.compile(rf"^{_ISO_PART}(?:/{_ISO_PART})?$")


def normalize_fact_time(value: str, utterance_time: str | None) -> str:
    """Accept an ISO date/interval as is; resolve a date phrase (an LLM wrote "yesterday"); else ``""``."""
    value = (value or "").strip()
    if not value or ISO_FACT_TIME.match(value):
        return value
    iso, _ = find_fact_time(value, utterance_time)
    return iso
