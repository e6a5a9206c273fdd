"""The one time resolver: date expressions in text → closed date intervals, for facts and questions.

Construction resolves "last week I moved" against the utterance time into a unit's fact time; query
parsing resolves "what did she do last week?" against the question time into a constraint; the
attribute channel then compares the two intervals directly. So both go through this module and a
phrase means the same interval on both sides:

=========================  ===============================================================
phrase                     interval (reference date ``r``; weeks run Monday–Sunday)
=========================  ===============================================================
today, tonight, this       ``r``
morning/afternoon/evening,
earlier today
yesterday, last night      ``r − 1``; "the day before yesterday" ``r − 2``; tomorrow ``r + 1``
this / last / next week    the calendar week of ``r`` / the one before / the one after
past week, past month,     the last 7 / 30 / 365 days up to ``r`` (rolling, not calendar)
past year, recently        "recently" = the last 30 days
this / last / next weekend Saturday–Sunday of the current week / the week before / after
this / last / next month   calendar months; the same for years
N days ago                 that day; N weeks / months / years ago: that day ± 3 / 15 / 182 days
last / this past Monday,   the most recent Monday before ``r``; "this Monday" the Monday of
on Monday, Monday          ``r``'s week; "next Monday" the first Monday after ``r``
May 3, 2021; 3 May 2021;   that day (without a year: in ``r``'s year; without ``r``: vague)
2021-05-03; 5/3/2021
May 2021, in 2019          the month / the year
=========================  ===============================================================

A relative phrase without a reference time is vague: facts get an empty fact time, questions an
unresolved time text. Questions may also shift an anchor ("two days before 8 May 2023"); an anchor that
is an event ("two days before the party") stays unresolved text.
"""

from __future__ import annotations

import calendar
import re
from dataclasses import dataclass
from datetime import date, datetime, timedelta, timezone

MONTHS = {name.lower(): i for i, name in enumerate(calendar.month_name) if name}
MONTHS.update({name.lower(): i for i, name in enumerate(calendar.month_abbr) if name})
MONTHS["sept"] = 9
WEEKDAYS = {name.lower(): i for i, name in enumerate(calendar.day_name)}
NUMBER_WORDS = {"a": 1, "an": 1, "one": 1, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6, "seven": 7,
                "eight": 8, "nine": 9, "ten": 10, "a couple of": 2, "couple of": 2, "a few": 3, "few": 3,
                "several": 3}
UNIT_DAYS = {"day": 1, "week": 7, "month": 30, "year": 365}
AGO_SLACK_DAYS = {"day": 0, "week": 3, "month": 15, "year": 182}

_MONTH = (r"(?:jan(?:uary)?|feb(?:ruary)?|mar(?:ch)?|apr(?:il)?|may|june?|july?|aug(?:ust)?|"
          r"sep(?:t(?:ember)?)?|oct(?:ober)?|nov(?:ember)?|dec(?:ember)?)")
_WEEKDAY = "(?:monday|tuesday|wednesday|thursday|friday|saturday|sunday)"
_NUM = r"(?:\d+|a couple of|couple of|a few|few|several|an?|one|two|three|four|five|six|seven|eight|nine|ten)"

#: every expression this module resolves; the named group says which rule applies
TIME_PATTERN = re.compile(
    r"\b(?:"
    r"(?P<iso>\d{4}-\d{2}-\d{2})"
    r"|(?P<numeric>\d{1,2}/\d{1,2}/\d{4})"
    rf"|(?P<md>{_MONTH}\.?\s+\d{{1,2}}(?:st|nd|rd|th)?(?:,?\s+\d{{4}})?)"
    rf"|(?P<dm>\d{{1,2}}(?:st|nd|rd|th)?\s+(?:of\s+)?{_MONTH}\.?(?:,?\s+\d{{4}})?)"
    rf"|(?P<my>{_MONTH}\.?,?\s+(?:of\s+)?\d{{4}})"
    rf"|(?P<ago>{_NUM}\s+(?:day|week|month|year)s?\s+ago)"
    r"|(?P<span>(?:last|next|this|past|the\s+past)\s+(?:week|month|year|weekend))"
    rf"|(?P<wd>(?:last|next|this|this\s+past|on)\s+{_WEEKDAY})"
    r"|(?P<rel>the\s+day\s+before\s+yesterday|yesterday|today|tonight|tomorrow|last\s+night|earlier\s+today|"
    r"this\s+(?:morning|afternoon|evening)|recently)"
    r"|(?P<year>(?:in|since|back\s+in|during|of)\s+(?:19|20)\d{2})"
    rf"|(?P<bare>{_WEEKDAY})"
    r")\b",
    re.IGNORECASE,
)
_SHIFT = re.compile(rf"\b({_NUM})\s+(day|week|month|year)s?\s+(before|after)\s+(.+?)(?:[?.!,;]|$)", re.I)
_ABSOLUTE = ("iso", "numeric", "md", "dm", "my", "year")


@dataclass(frozen=True)
class TimeSpan:
    """A closed interval of dates plus the words it came from."""

    start: date
    end: date
    text: str

    def iso(self) -> str:
        """``YYYY-MM-DD`` for one day, ``start/end`` for an interval (a unit's ``fact_time`` form)."""
        return self.start.isoformat() if self.start == self.end else f"{self.start.isoformat()}/{self.end.isoformat()}"


# --------------------------------------------------------------------------------------------------
# reading stored values


def parse_time(value: str | None) -> datetime | None:
    """An ISO-8601 time as an instant, a naive datetime in UTC; ``None`` when absent or unreadable.

    The one rule for comparing times: a time with a UTC offset (``Z``, ``+05:00``) is that instant, so
    ``2024-05-02T05:00:00+05:00`` and ``2024-05-02T00:00:00Z`` are equal; a time without an offset (and
    a date, at its midnight) is read as UTC."""
    local = _wall_clock(value)
    if local is None or local.tzinfo is None:
        return local
    return local.astimezone(timezone.utc).replace(tzinfo=None)


def _wall_clock(value: str | None) -> datetime | None:
    """The datetime as written, with its offset when it has one."""
    if not value:
        return None
    try:
        return datetime.fromisoformat(value.strip().replace("Z", "+00:00"))
    except ValueError:
        return None


def parse_iso_date(value: str | None) -> date | None:
    """The calendar date an ISO-8601 date or datetime was written on (``YYYY``/``YYYY-MM`` pad to the 1st).

    The speaker's own date, not UTC's: "yesterday" said at ``2024-05-02T23:00:00-05:00`` is 1 May, as
    the speaker meant it (comparing instants is :func:`parse_time`'s rule)."""
    if not value:
        return None
    parsed = _wall_clock(value)
    if parsed is not None:
        return parsed.date()
    m = re.match(r"^(\d{4})(?:-(\d{2}))?(?:-(\d{2}))?", value.strip())
    if not m:
        return None
    try:
        return date(int(m.group(1)), int(m.group(2) or 1), int(m.group(3) or 1))
    except ValueError:
        return None


def parse_fact_time(value: str | None) -> tuple[date, date] | None:
    """A unit's ``fact_time`` (``YYYY-MM-DD``, ``YYYY-MM``, ``YYYY`` or ``a/b``) as a date interval."""
    if not value or not value.strip():
        return None
    spans = [_granular_span(p.strip()) for p in value.strip().split("/")[:2]]
    if any(s is None for s in spans):
        return None
    return spans[0][0], spans[-1][1]  # type: ignore[index]


_ISO_PART = r"\d{4}(?:-\d{2}(?:-\d{2})?)?"
ISO_FACT_TIME = re.compile(rf"^{_ISO_PART}(?:/{_ISO_PART})?$")


def _granular_span(value: str) -> tuple[date, date] | None:
    m = re.match(r"^(\d{4})(?:-(\d{2}))?(?:-(\d{2}))?$", value)
    if not m:
        return None
    year = int(m.group(1))
    try:
        if m.group(3):
            d = date(year, int(m.group(2)), int(m.group(3)))
            return d, d
        if m.group(2):
            return month_span(year, int(m.group(2)))
        return date(year, 1, 1), date(year, 12, 31)
    except ValueError:
        return None


# --------------------------------------------------------------------------------------------------
# resolving one expression


def month_span(year: int, month: int) -> tuple[date, date]:
    return date(year, month, 1), date(year, month, calendar.monthrange(year, month)[1])


def _month(name: str) -> int:
    name = name.lower().rstrip(".")
    return MONTHS.get(name) or MONTHS[name[:3]]


def _number(word: str) -> int:
    word = " ".join(word.lower().split())
    return int(word) if word.isdigit() else NUMBER_WORDS[word]


def _shift_month(day: date, months: int) -> tuple[int, int]:
    index = day.year * 12 + day.month - 1 + months
    return index // 12, index % 12 + 1


def _day(year: int, month: int, day: int) -> tuple[date, date] | None:
    try:
        d = date(year, month, day)
    except ValueError:
        return None
    return d, d


def resolve_match(match: re.Match, ref: date | None) -> TimeSpan | None:
    """The interval of one :data:`TIME_PATTERN` match; ``None`` when it needs a reference it lacks."""
    kind = match.lastgroup
    phrase = " ".join(match.group(0).lower().split())
    span: tuple[date, date] | None = None
    if kind == "iso":
        y, m, d = map(int, phrase.split("-"))
        span = _day(y, m, d)
    elif kind == "numeric":  # US order, as the benchmarks write it
        m, d, y = map(int, phrase.split("/"))
        span = _day(y, m, d)
    elif kind in ("md", "dm"):
        year = re.search(r"\d{4}", phrase)
        month = _month(re.search(_MONTH, phrase).group(0))
        day = int(re.search(r"\b(\d{1,2})(?:st|nd|rd|th)?\b", phrase.replace(year.group(0), "") if year else phrase).group(1))
        if year is not None or ref is not None:
            span = _day(int(year.group(0)) if year else ref.year, month, day)
    elif kind == "my":
        span = month_span(int(phrase[-4:]), _month(re.search(_MONTH, phrase).group(0)))
    elif kind == "year":
        y = int(phrase[-4:])
        span = date(y, 1, 1), date(y, 12, 31)
    elif ref is None:
        return None
    elif kind == "ago":
        number, unit = re.match(rf"({_NUM})\s+(day|week|month|year)", phrase).groups()
        center = ref - timedelta(days=_number(number) * UNIT_DAYS[unit])
        slack = timedelta(days=AGO_SLACK_DAYS[unit])
        span = center - slack, center + slack
    elif kind == "span":
        which, unit = phrase.removeprefix("the ").split()
        span = _calendar_span(which, unit, ref)
    elif kind in ("wd", "bare"):
        which = phrase.rsplit(" ", 1)[0] if " " in phrase else "on"
        target = WEEKDAYS[phrase.rsplit(" ", 1)[-1]]
        if which == "next":
            d = ref + timedelta(days=(target - ref.weekday()) % 7 or 7)
        elif which == "this":
            d = ref - timedelta(days=ref.weekday()) + timedelta(days=target)
        else:  # last, this past, on, bare: the most recent one before the reference day
            d = ref - timedelta(days=(ref.weekday() - target) % 7 or 7)
        span = d, d
    elif kind == "rel":
        if phrase == "recently":
            span = ref - timedelta(days=30), ref
        else:
            offset = {"yesterday": -1, "last night": -1, "the day before yesterday": -2, "tomorrow": 1}.get(phrase, 0)
            d = ref + timedelta(days=offset)
            span = d, d
    if span is None:
        return None
    return TimeSpan(span[0], span[1], match.group(0))


def _calendar_span(which: str, unit: str, ref: date) -> tuple[date, date]:
    if which == "past":  # rolling: the last 7 / 30 / 365 days
        if unit == "weekend":
            which = "last"
        else:
            return ref - timedelta(days=UNIT_DAYS[unit]), ref
    step = {"last": -1, "this": 0, "next": 1}[which]
    monday = ref - timedelta(days=ref.weekday())
    if unit == "week":
        start = monday + timedelta(days=7 * step)
        return start, start + timedelta(days=6)
    if unit == "weekend":
        saturday = monday + timedelta(days=5 + 7 * step)
        return saturday, saturday + timedelta(days=1)
    if unit == "month":
        return month_span(*_shift_month(ref, step))
    return date(ref.year + step, 1, 1), date(ref.year + step, 12, 31)


# --------------------------------------------------------------------------------------------------
# facts and questions


def find_time(text: str, ref: date | None) -> tuple[TimeSpan | None, str]:
    """The first time expression in ``text``: ``(span, phrase)``; ``span`` is ``None`` when it is vague
    without ``ref``; ``(None, "")`` when there is no expression at all."""
    match = TIME_PATTERN.search(text)
    if match is None:
        return None, ""
    return resolve_match(match, ref), match.group(0)


def find_fact_time(text: str, utterance_time: str | None) -> tuple[str, str]:
    """A unit's fact time: ``(iso, phrase)`` of the first expression in ``text`` (``("", "")`` when none)."""
    span, phrase = find_time(text, parse_iso_date(utterance_time))
    return (span.iso() if span is not None else ""), phrase


def normalize_fact_time(value: str, utterance_time: str | None) -> str:
    """Accept an ISO date/interval as is; resolve a phrase (an LLM wrote "yesterday"); else ``""``."""
    value = (value or "").strip()
    if not value or ISO_FACT_TIME.match(value):
        return value
    return find_fact_time(value, utterance_time)[0]


def resolve_time(text: str, question_time: str | None) -> tuple[TimeSpan | None, str]:
    """A question's time constraint, and any time expression left unresolved.

    "two days before 8 May 2023" shifts the anchor; "two days before the party" names an event, so it is
    returned as unresolved text (the event itself is still matched by the lexical and semantic channels).
    An absolute date anywhere in the question wins over a relative phrase.
    """
    ref = parse_iso_date(question_time)
    if m := _SHIFT.search(text):
        n, unit, direction, anchor_text = _number(m.group(1)), m.group(2).lower(), m.group(3).lower(), m.group(4)
        anchor, _ = find_time(anchor_text, ref)
        phrase = m.group(0).rstrip("?.!,; ")
        if anchor is None:
            return None, phrase
        shift = timedelta(days=n * UNIT_DAYS[unit]) * (-1 if direction == "before" else 1)
        return TimeSpan(anchor.start + shift, anchor.end + shift, phrase), ""
    matches = list(TIME_PATTERN.finditer(text))
    if not matches:
        return None, ""
    matches.sort(key=lambda m: m.lastgroup not in _ABSOLUTE)  # stable: absolute first, then text order
    for match in matches:
        span = resolve_match(match, ref)
        if span is not None:
            return span, ""
    return None, matches[0].group(0)
