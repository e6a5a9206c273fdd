"""Property-based fuzzing of LLM-reply parsing: the JSON extractor, the construction-reply validator
and the consolidation-reply validator. Any text (truncated JSON, wrong types, missing keys, control
characters, very long strings, repeated ids) yields a value or the parser's own named error; a valid
reply wrapped in noise is still read."""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from qgmem.llm.backends import CallableBackend
from qgmem.llm.base import reply_problem
from qgmem.llm.parsing import JSONExtractionError, extract_json
from qgmem.memory.extract_llm import ReplyValidationError, UnitSpec, parse_reply
from qgmem.memory.traces import _validate_consolidation

FUZZ = settings(max_examples=150, deadline=None, derandomize=True)
CONTROL = "".join(chr(c) for c in range(0, 32)) + "\x7f\u2028\ufeff"

text_values = st.one_of(st.text(max_size=20), st.text(alphabet=st.sampled_from(CONTROL), max_size=10),
                        st.integers(min_value=1, max_value=50_000).map(lambda n: "y" * n))
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True, allow_infinity=True) | text_values,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=10,
)
unit_keys = ["fact", "turn_start", "turn_end", "subject", "predicate", "object", "entities", "location", "fact_time"]
units = st.fixed_dictionaries({}, optional={k: json_values for k in unit_keys})
replies = st.one_of(
    st.text(max_size=300),
    json_values.map(json.dumps),
    st.lists(units, max_size=4).map(lambda us: json.dumps({"units": us})),
    st.lists(units, max_size=4).map(json.dumps),
)


@st.composite
def noisy(draw, core: st.SearchStrategy[str]):
    """A reply as a model might send it: prose, fences or ``<think>`` around, maybe cut short."""
    text = draw(core)
    wrap = draw(st.sampled_from(["{}", "```json\n{}\n```", "Sure! {} Hope this helps.", "<think>hmm</think>{}",
                                 "<think>{}", "{}{}"]))
    text = wrap.replace("{}", text, 1).replace("{}", draw(st.text(max_size=20)))
    if draw(st.booleans()):
        text = text[: draw(st.integers(min_value=0, max_value=len(text)))]
    return text


@FUZZ
@given(text=noisy(replies), expect=st.sampled_from([dict, list]))
def test_extract_json_returns_the_type_or_a_named_error(text, expect):
    try:
        value = extract_json(text, expect=expect)
    except JSONExtractionError as exc:
        assert str(exc)
    else:
        assert isinstance(value, expect)


@FUZZ
@given(text=noisy(replies))
def test_construction_reply_parses_or_says_why(text):
    try:
        specs = parse_reply(text)
    except ReplyValidationError as exc:
        assert str(exc)
    else:
        assert all(isinstance(s, UnitSpec) and s.fact and s.subject and s.predicate and s.object for s in specs)


consolidation_replies = st.builds(
    lambda members, transitions: json.dumps({"members": members, "transitions": transitions}),
    st.lists(st.sampled_from(["M1", "M2", "M3", "M9"]) | json_values, max_size=5),
    st.dictionaries(st.text(max_size=3), json_values, max_size=3) | json_values)


@FUZZ
@given(text=noisy(st.one_of(replies, consolidation_replies)))
def test_consolidation_reply_parses_or_says_why(text):
    labels = ["M1", "M2", "M3"]
    try:
        members, transitions = _validate_consolidation(text, labels)
    except ValueError as exc:
        assert str(exc)
    else:
        assert set(members) <= set(labels) and set(transitions.values()) <= {"update", "supplement"}


@FUZZ
@given(before=st.text(alphabet=st.characters(blacklist_characters="{[`<"), max_size=50),
       after=st.text(max_size=50), facts=st.lists(st.text(min_size=1, max_size=40).filter(str.strip), min_size=1,
                                                  max_size=3))
def test_a_valid_reply_inside_noise_is_kept(before, after, facts):
    reply = {"units": [{"fact": f, "turn_start": "T1", "turn_end": "T1", "subject": "User", "predicate": "said",
                        "object": f} for f in facts]}
    specs = parse_reply(f"{before}```json\n{json.dumps(reply)}\n```{after}")
    assert [s.fact for s in specs] == [f.strip() for f in facts]


@FUZZ
@given(text=noisy(replies))
def test_backend_check_never_raises(text):
    """Whatever the reply, the backend's check returns a result (usable or not), never an exception."""
    backend = CallableBackend(lambda messages: text)
    [result] = backend.chat([[{"role": "user", "content": "q"}]], validate=parse_reply)
    assert result.ok == (reply_problem(text, parse_reply) is None)
    assert result.ok or result.error
