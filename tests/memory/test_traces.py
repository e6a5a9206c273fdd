from __future__ import annotations

import json

import pytest

from qgmem.llm.backends import CallableBackend
from qgmem.memory.builder import MemoryBuilder
from qgmem.memory.config import ConstructionConfig
from qgmem.memory.records import MemoryUnit
from qgmem.memory.traces import build_traces, canonical_relation, rule_transition

from .helpers import BagOfWordsEncoder, make_dialogue

MOVING = [
    [("User", "I live in Boston."), ("Assistant", "Boston is a great city."),
     ("User", "I use green for hot leads in my spreadsheet."), ("Assistant", "Nice system.")],
    [("User", "I use a French press for my coffee every morning."), ("Assistant", "Sounds tasty."),
     ("User", "I moved to Denver last month."), ("Assistant", "How is Denver treating you?"),
     ("User", "I use yellow for warm leads in my spreadsheet."), ("Assistant", "Got it.")],
]


def _unit(i, subject, predicate, obj, fact):
    return MemoryUnit(id=f"u{i}", dialogue_id="d", session_id="s", window_id="w", fact=fact, subject=subject,
                      predicate=predicate, object=obj, source_turn_ids=[f"t{i}"], source_text=fact, order=i)


@pytest.mark.parametrize("predicate,relation", [
    ("lives in", "lives in"), ("moved to", "lives in"), ("relocated to", "lives in"), ("is based in", "lives in"),
    ("works at", "works at"), ("joined", "works at"), ("uses", "uses"), ("switched to", "uses"), ("is", "is"),
    ("is allergic to", "allergic"), ("has been using", "uses"), ("would recommend", "recommend"),
])
def test_canonical_relation(predicate, relation):
    assert canonical_relation(predicate) == relation


@pytest.mark.parametrize("before,after,expected", [
    (("User", "lives in", "Boston", "User lives in Boston."), ("User", "moved to", "Denver", "User moved to Denver."),
     "update"),
    (("User", "uses", "green for hot leads", "User uses green for hot leads."),
     ("User", "uses", "yellow for warm leads", "User uses yellow for warm leads."), "supplement"),
    (("User", "uses", "a CRM", "User uses a CRM."), ("User", "switched to", "HubSpot", "User switched to HubSpot."),
     "update"),
    (("User's favorite color", "is", "blue", "User's favorite color is blue."),
     ("User's favorite color", "is", "green", "User's favorite color is green."), "update"),
    (("User's spreadsheet", "is", "color-coded", "User's spreadsheet is color-coded."),
     ("User's spreadsheet", "is", "reliable", "User's spreadsheet is reliable."), "supplement"),
    (("User", "lives in", "Boston", "User lives in Boston."),
     ("User", "lives in", "Boston's South End", "User lives in Boston's South End."), "supplement"),
])
def test_rule_transition(before, after, expected):
    assert rule_transition(_unit(0, *before), _unit(1, *after)) == expected


def test_groups_need_both_key_and_fact_similarity():
    encoder = BagOfWordsEncoder()
    units = [_unit(0, "User", "lives in", "Boston", "User lives in Boston with family."),
             _unit(1, "User", "uses", "a French press", "User uses a French press."),
             _unit(2, "User", "moved to", "Denver", "User moved to Denver with family."),
             _unit(3, "Cooper", "likes", "the yard", "Cooper likes the yard.")]
    config = ConstructionConfig(min_fact_similarity=0.3)
    report = build_traces(units, encoder.encode([u.fact for u in units]), encoder.encode, config)
    [trace] = report.traces
    assert (trace.unit_ids, trace.transitions, trace.latest_unit_id) == (["u0", "u2"], ["origin", "update"], "u2")
    assert [u.trace_id for u in units] == [trace.id, None, trace.id, None]
    strict = ConstructionConfig(min_fact_similarity=0.9)
    assert build_traces(units, encoder.encode([u.fact for u in units]), encoder.encode, strict).traces == []


def test_llm_consolidation_decides_and_may_drop_members():
    encoder = BagOfWordsEncoder()
    units = [_unit(i, "User", "uses", o, f"User uses {o} for leads.") for i, o in enumerate(["green", "yellow", "red"])]
    replies = iter(["not json", json.dumps({"members": ["M1", "M3"], "transitions": {"M3": "update"}})])
    llm = CallableBackend(lambda m: next(replies), "recorded")
    report = build_traces(units, encoder.encode([u.fact for u in units]), encoder.encode,
                          ConstructionConfig(consolidation="llm"), llm=llm)
    [trace] = report.traces
    assert (trace.unit_ids, trace.transitions, report.llm_fallbacks) == (["u0", "u2"], ["origin", "update"], 0)
    assert units[1].trace_id is None and llm.usage.requests == 2


def test_llm_consolidation_failure_falls_back_to_the_rule():
    encoder = BagOfWordsEncoder()
    units = [_unit(i, "User", "uses", o, f"User uses {o} for leads.") for i, o in enumerate(["green", "yellow"])]
    llm = CallableBackend(lambda m: "still not json", "recorded")
    report = build_traces(units, encoder.encode([u.fact for u in units]), encoder.encode,
                          ConstructionConfig(consolidation="llm"), llm=llm)
    assert report.llm_fallbacks == 1 and report.traces[0].transitions == ["origin", "supplement"]


def test_changed_answer_becomes_an_update_with_the_real_encoder(sentence_encoder):
    dialogue = make_dialogue(MOVING, times=["2023-03-01T10:00:00", "2023-05-08T10:00:00"])
    builder = MemoryBuilder(ConstructionConfig(), sentence_encoder)
    store = builder.build(dialogue)
    boston = next(u for u in store.units if u.object == "Boston")
    denver = next(u for u in store.units if u.object.startswith("Denver"))
    trace = store.trace_of(denver)
    assert trace is not None and trace is store.trace_of(boston)
    assert trace.unit_ids == [boston.id, denver.id] and trace.transitions == ["origin", "update"]
    assert trace.latest_unit_id == denver.id and denver.fact_time == "2023-04-01/2023-04-30"
    press = next(u for u in store.units if "French press" in u.object)
    assert press.trace_id is None or press.trace_id != store.trace_of(
        next(u for u in store.units if u.object.startswith("green"))).id
    assert builder.stats.updates >= 1 and builder.stats.traces == len(store.traces)


@pytest.mark.parametrize("subject,predicate,expected", [
    ("User", "thinks", False), ("User", "needs to", False), ("User", "is", False), ("User", "was thinking", False),
    ("User's favorite color", "is", True), ("User", "lives in", True), ("User", "uses", True),
    ("Assistant", "recommends", False), ("User", "answers", False), ("User", "mentions", False),
    ("User", "finished", False), ("User", "got", False), ("User", "moved to", True),
    ("User's manager", "is", True), ("Cooper", "likes", True), ("Cooper", "is thinking about", False),
])
def test_only_state_relations_are_traced(subject, predicate, expected):
    from qgmem.memory.traces import traceable

    unit = _unit(0, subject, predicate, "x", f"{subject} {predicate} x.")
    unit.speaker = "User"
    assert traceable(unit) is expected


def test_talk_and_thought_never_form_traces():
    encoder = BagOfWordsEncoder()
    units = [_unit(i, "User", "thinks", o, f"User thinks about {o} a lot.") for i, o in enumerate(["work", "dinner"])]
    report = build_traces(units, encoder.encode([u.fact for u in units]), encoder.encode, ConstructionConfig())
    assert report.traces == [] and all(u.trace_id is None for u in units)


@pytest.mark.parametrize("predicate", ["answers", "mentions", "finished", "shares an image of"])
def test_replies_and_events_of_a_person_never_form_traces(predicate):
    encoder = BagOfWordsEncoder()
    units = [_unit(i, "User", predicate, o, f'User, asked "What next?": {o} then.')
             for i, o in enumerate(["yes", "no", "maybe"])]
    report = build_traces(units, encoder.encode([u.fact for u in units]), encoder.encode,
                          ConstructionConfig(min_fact_similarity=0.0, trace_threshold=0.5))
    assert report.traces == [] and all(u.trace_id is None for u in units)
