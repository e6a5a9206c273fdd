from __future__ import annotations

import json

import pytest

from qgmem.llm.backends import CallableBackend
from qgmem.memory.builder import ConstructionFailed, MemoryBuilder
from qgmem.memory.config import ConstructionConfig
from qgmem.memory.extract_llm import ReplyValidationError, parse_reply

from .helpers import make_dialogue

TURNS = [
    ("User", "Hi!"), ("Assistant", "Hello, how can I help?"),
    ("User", "I adopted a beagle named Cooper yesterday."), ("Assistant", "Congratulations on Cooper!"),
    ("User", "He loves the backyard."), ("Assistant", "Beagles need lots of exercise."),
    ("User", "I walk him at 6 am every day."), ("Assistant", "A good routine."),
    ("User", "Thanks, bye."), ("Assistant", "Bye!"),
]


def _unit(fact, start, end=None, **extra):
    return {"fact": fact, "turn_start": start, "turn_end": end or start, "subject": "User",
            "predicate": "has", "object": "x", "entities": [], "location": "", "fact_time": "", **extra}


def _units(*units):
    return json.dumps({"units": list(units)})


def _window(messages) -> int:
    """Which window a construction prompt is for (0 or 1), read from its turn texts."""
    text = messages[1]["content"]
    return 0 if "Hi!" in text else 1


def _build(replies, config=None):
    """replies[window] is a list of texts returned for successive attempts of that window."""
    attempts = {0: 0, 1: 0}
    prompts = []

    def respond(messages):
        prompts.append(messages)
        w = _window(messages)
        reply = replies[w][min(attempts[w], len(replies[w]) - 1)]
        attempts[w] += 1
        if isinstance(reply, Exception):
            raise reply
        return reply

    from .helpers import BagOfWordsEncoder

    dialogue = make_dialogue([TURNS], times=["2023-05-08T09:00:00"])
    builder = MemoryBuilder(config or ConstructionConfig(extractor="llm", consolidation="rule"),
                            BagOfWordsEncoder(), llm=CallableBackend(respond, "recorded"))
    return builder.build(dialogue), builder.stats, prompts


GOOD_0 = "<think>Only Cooper matters.</think>\n```json\n" + _units(
    _unit("User adopted a beagle named Cooper.", "T3", fact_time="yesterday", entities=["Cooper"]),
    _unit("Cooper loves the backyard.", "T5", "T6", subject="Cooper")) + "\n```\nHope this helps!"
GOOD_1 = _units(_unit("User walks Cooper at 6 am every day.", "T3"),
                _unit("Cooper loves the backyard.", "T1", "T2"),  # only context turns: dropped
                _unit("Beagles need exercise; User walks Cooper daily.", "T2", "T3"))  # spans into new: kept


def test_recorded_replies_become_grounded_units():
    store, stats, prompts = _build({0: [GOOD_0], 1: [GOOD_1]})
    assert [u.source_turn_ids for u in store.units] == [["s0:2"], ["s0:4", "s0:5"], ["s0:5", "s0:6"], ["s0:6"]]
    first = store.units[0]
    assert (first.fact_time, first.utterance_time, first.entities, first.order) == (
        "2023-05-07", "2023-05-08T09:00:00", ["Cooper"], 2)
    assert stats.overlap_only_units == 1 and stats.skipped_windows == 0 and stats.windows == 2
    assert stats.llm_requests == 2 and stats.llm_calls == 2 and stats.llm_requests / stats.turns <= 0.3
    assert "[T1] [CONTEXT]" in prompts[1][1]["content"] and "[CONTEXT]" not in prompts[0][1]["content"]
    assert store.embeddings.shape == (4, 512)


def test_invalid_reply_is_retried_once_with_the_error():
    broken = _units({"fact": "no bounds", "subject": "User", "predicate": "p", "object": "o"})
    store, stats, prompts = _build({0: [broken, GOOD_0], 1: [GOOD_1]})
    assert stats.retried_windows == 1 and stats.skipped_windows == 0 and len(store.units) == 4
    retry = [p for p in prompts if len(p) == 4]
    assert len(retry) == 1 and "units[0].turn_start: must be a non-empty string" in retry[0][3]["content"]
    assert stats.llm_requests == 3


@pytest.mark.parametrize("junk", ["I cannot help with that.", '{"units": "none"}', _units(_unit("f", "T9")),
                                  _units(_unit("f", "T4", "T2")), "```json\n{\"units\": [\n```"])
def test_still_invalid_after_retry_skips_only_that_window(junk):
    store, stats, _ = _build({0: [junk], 1: [GOOD_1]})
    assert stats.skipped_windows == 1 and stats.skip_reasons == {"invalid_reply": 1}
    assert stats.retried_windows == 1 and stats.llm_requests == 3
    assert [u.window_id for u in store.units] == ["w0001", "w0001"]
    assert stats.skipped_examples[0].startswith("d1/w0000: invalid reply after 2 attempts")


def test_backend_error_skips_the_window_without_a_retry():
    store, stats, _ = _build({0: [GOOD_0], 1: [TimeoutError("read timed out")]})
    assert stats.skip_reasons == {"llm_error": 1} and stats.retried_windows == 0 and stats.llm_requests == 2
    assert len(store.units) == 2 and "read timed out" in stats.skipped_examples[0]


@pytest.mark.parametrize("reply,message", [
    ('{"units": [{"fact": "x", "turn_start": "T1", "subject": "", "predicate": "p", "object": "o"}]}',
     r"units\[0\].subject: must be a non-empty string"),
    ('{"units": [{"fact": "x", "turn_start": "T1", "subject": "s", "predicate": "p", "object": "o", '
     '"entities": [1]}]}', r"units\[0\].entities"),
    ('{"units": [42]}', r"units\[0\]: expected an object"),
    ("nothing", "no JSON object"),
])
def test_validation_errors_name_unit_and_field(reply, message):
    with pytest.raises(ReplyValidationError, match=message):
        parse_reply(reply)


def test_bare_list_and_lenient_types_are_accepted():
    [spec] = parse_reply('[{"fact": "x", "turn_start": "T2", "subject": "s", "predicate": "p", "object": 3, '
                         '"entities": "Acme", "location": null}]')
    assert (spec.turn_end, spec.object, spec.entities, spec.location) == ("T2", "3", ["Acme"], "")


def test_end_to_end_through_local_smollm2(tmp_path):
    """The real embedded SmolLM2 (135M) rarely writes valid unit JSON; the accounting must still add up."""
    from qgmem.llm.backends import LLMConfig, make_backend

    from .helpers import BagOfWordsEncoder

    backend = make_backend(LLMConfig(backend="transformers", batch_size=2, cache_path=str(tmp_path / "c.sqlite")))
    config = ConstructionConfig(extractor="llm", consolidation="rule", max_new_tokens=32)
    builder = MemoryBuilder(config, BagOfWordsEncoder(), llm=backend)
    dialogue = make_dialogue([TURNS[:4]], times=["2023-05-08T09:00:00"])

    def build(b):
        """The store, or ``None`` when its one window failed (such a dialogue is no finished store)."""
        try:
            return b.build(dialogue)
        except ConstructionFailed as exc:
            assert "1 of 1 windows got no usable LLM reply" in str(exc)
            return None

    store = build(builder)
    s = builder.stats
    assert s.windows == 1 and s.llm_requests == s.windows + s.retried_windows == s.llm_calls
    assert (store is None) == (s.skipped_windows == 1)
    assert s.skip_reasons.get("invalid_reply", 0) + s.skip_reasons.get("llm_error", 0) == s.skipped_windows
    assert s.prompt_tokens > 200 and 0 < s.completion_tokens <= 32 * s.llm_calls
    for unit in store.units if store is not None else []:  # whatever it did produce is grounded in the window's turns
        assert set(unit.source_turn_ids) <= {t.id for t in dialogue.turns()} and unit.subject and unit.object
    failed = backend.usage.errors - backend.usage.unusable  # requests with no reply: never cached
    empty = sum(1 for e in s.skipped_examples if "empty reply" in e)  # empty replies: never cached either
    assert len(backend) >= s.llm_requests - failed - 2 * empty
    again = MemoryBuilder(config, BagOfWordsEncoder(), llm=backend)
    rebuilt = build(again)
    assert (rebuilt is None) == (store is None)  # greedy: the rejected replies replay, rejected again
    if store is not None:
        assert [u.to_dict() for u in rebuilt.units] == [u.to_dict() for u in store.units]
    assert again.stats.llm_cache_hits == len(backend) and again.stats.llm_calls == s.llm_requests - len(backend)
