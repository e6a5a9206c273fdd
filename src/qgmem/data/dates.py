"""Date strings of the benchmarks → ISO-8601, so later stages compare times as plain strings.

The known layouts are parsed with fixed formats (fast, unambiguous); anything else falls back to
``dateparser`` with day-first off and no relative-date guessing, so a free-form date still works but a
garbled one fails loudly instead of turning into "today".
"""

from __future__ import annotations

from datetime import datetime

#: LoCoMo ``session_N_date_time`` ("1:56 pm on 8 May, 2023") and LongMemEval ("2023/05/20 (Sat) 02:21")
KNOWN_FORMATS = (
    "%I:%M %p on %d %B, %Y",
    "%I:%M %p on %d %b, %Y",
    "%Y/%m/%d (%a) %H:%M",
    "%Y/%m/%d %H:%M",
    "%Y-%m-%dT%H:%M:%S",
    "%Y-%m-%d %H:%M:%S",
    "%Y-%m-%d",
)


def to_iso(text: str) -> str:
    """ISO-8601 (``YYYY-MM-DDTHH:MM:SS``) of a benchmark date string; ``ValueError`` if unparseable."""
    cleaned = " ".join(text.split())
    for fmt in KNOWN_FORMATS:
        try:
            return datetime.strptime(cleaned, fmt).isoformat()
        except ValueError:
            continue
    import dateparser  # slow to import; only for layouts the fixed formats miss

    parsed = dateparser.parse(
        cleaned, languages=["en"],
        settings={"PREFER_DAY_OF_MONTH": "first", "RETURN_AS_TIMEZONE_AWARE": False,
                  "STRICT_PARSING": True, "PARSERS": ["absolute-time", "custom-formats"]},
    )
    if parsed is None:
        raise ValueError(f"unparseable date {text!r}")
    return parsed.replace(microsecond=0).isoformat()
