"""Evidence mapping: text spans → turns (exact → contained → fuzzy) and LoCoMo id normalisation."""

from __future__ import annotations

import pytest

from qgmem.data.evidence import EvidenceCounts, SpanMatcher, normalize_dia_ids, normalize_text
from qgmem.data.records import Turn

TURNS = [
    Turn(id="s:0", session_id="s", speaker="User", role="user", text="Hey, how are you today?"),
    Turn(id="s:1", session_id="s", speaker="Assistant", role="assistant",
         text="Exactly. I suggested Zapier to link your spreadsheet with Salesforce."),
    Turn(id="s:2", session_id="s", speaker="User", role="user",
         text="I use green for hot leads in my personal spreadsheet."),
    Turn(id="s:3", session_id="s", speaker="User", role="user",
         text="My dog Cooper loves the new backyard, it’s huge and he runs around all day long."),
]


@pytest.mark.parametrize(
    ("span", "role", "turn_id", "outcome"),
    [
        ("I use green for hot leads in my personal spreadsheet.", "user", "s:2", "exact"),
        ("  I use green for hot leads in my personal spreadsheet. ", None, "s:2", "exact"),
        ("i use GREEN for hot leads in my  personal spreadsheet.", "user", "s:2", "exact"),
        ("I suggested Zapier to link your spreadsheet with Salesforce.", "assistant", "s:1", "contained"),
        ("My dog Cooper loves the new backyard, it's huge", "user", "s:3", "contained"),
        ("My dog Cooper adores the new backyard, it's huge and he runs around all day.", "user", "s:3", "fuzzy"),
        ("Blue is for long-term follow-ups only.", "user", None, "unmatched"),
        ("hot", "user", None, "unmatched"),
        ("", None, None, "unmatched"),
    ],
)
def test_span_matcher_outcomes(span, role, turn_id, outcome):
    match = SpanMatcher(80).match(span, TURNS, role)
    assert (match.turn_id, match.outcome) == (turn_id, outcome)


def test_span_matcher_prefers_the_evidence_speaker():
    turns = [Turn(id="a", session_id="s", speaker="Assistant", role="assistant", text="Sounds great to me."),
             Turn(id="u", session_id="s", speaker="User", role="user", text="Sounds great to me.")]
    assert SpanMatcher().match("Sounds great to me.", turns, "user").turn_id == "u"
    assert SpanMatcher().match("Sounds great to me.", turns, "assistant").turn_id == "a"


@pytest.mark.parametrize(("threshold", "outcome"), [(70.0, "fuzzy"), (99.0, "unmatched")])
def test_fuzzy_threshold_decides(threshold, outcome):
    span = "My dog Cooper adores the new backyard, it's huge and he runs around all day."
    assert SpanMatcher(threshold).match(span, TURNS, "user").outcome == outcome


@pytest.mark.parametrize("threshold", [0, -5, 101])
def test_bad_threshold_rejected(threshold):
    with pytest.raises(ValueError, match="fuzzy_threshold"):
        SpanMatcher(threshold)


def test_normalize_text_keeps_letters_unifies_typography():
    assert normalize_text("It’s  “café”\u00a0—  NAÏVE") == "it's \"café\" - naïve"


KNOWN = {"D1:1", "D1:2", "D1:3", "D2:1", "D2:5", "D13:1"}


@pytest.mark.parametrize(
    ("raw", "ids", "outcome"),
    [
        ("D1:3", ["D1:3"], "exact"),
        (" D1:3 ", ["D1:3"], "exact"),
        ("D1:3; D2:5", ["D1:3", "D2:5"], "normalized"),
        ("D1:3, D2:5", ["D1:3", "D2:5"], "normalized"),
        ("D:1:3", ["D1:3"], "normalized"),
        ("d1: 3", ["D1:3"], "normalized"),
        ("D01:03", ["D1:3"], "normalized"),
        ("D21", ["D2:1"], "normalized"),  # only D2:1 exists and there is no session 21
        ("D13", [], "unmatched"),  # D1:3 exists, but so does session 13: ambiguous
        ("D10", [], "unmatched"),  # D1:0 does not exist
        ("D9:9", [], "unmatched"),
        ("D1:3; D9:9", [], "unmatched"),
        ("D1:3:5", [], "unmatched"),
        ("session 1", [], "unmatched"),
    ],
)
def test_normalize_dia_ids(raw, ids, outcome):
    assert normalize_dia_ids(raw, KNOWN) == (ids, outcome)


def test_evidence_counts_total_and_examples():
    counts = EvidenceCounts()
    for outcome in ("exact", "exact", "contained", "fuzzy", "normalized", "unmatched"):
        counts.add(outcome, f"example {outcome}")
    d = counts.as_dict()
    assert (d["exact"], d["contained"], d["fuzzy"], d["normalized"], d["unmatched"], d["total"]) == (2, 1, 1, 1, 1, 6)
    assert d["unmatched_examples"] == ["example unmatched"]
