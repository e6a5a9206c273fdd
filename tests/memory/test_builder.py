from __future__ import annotations

import json

import pytest

from qgmem.llm.backends import CachedBackend, CallableBackend
from qgmem.memory.builder import MemoryBuilder
from qgmem.memory.config import ConstructionConfig

from .helpers import BagOfWordsEncoder, make_dialogue


def _dialogue():
    turns = [("User" if i % 2 == 0 else "Assistant", f"Statement number {i} about topic {i % 3}.") for i in range(22)]
    return make_dialogue([turns[:14], turns[14:]], dialogue_id="resume")


def _recorded(messages) -> str:
    """A deterministic 'model': one unit per non-context turn line in the prompt."""
    units = []
    for line in messages[1]["content"].splitlines():
        if line.startswith("[T") and "[CONTEXT]" not in line and line.split(": ", 1)[0].endswith("User"):
            label = line[1:line.index("]")]
            text = line.split(": ", 1)[1]
            units.append({"fact": f"User said: {text}", "turn_start": label, "turn_end": label, "subject": "User",
                          "predicate": "said", "object": text, "entities": [], "location": "", "fact_time": ""})
    return json.dumps({"units": units})


class _Killed(BaseException):
    """The process dying mid-build (not an Exception, so nothing in the build may swallow it)."""


def _builder(fn, cache):
    backend = CachedBackend(CallableBackend(fn, "recorded"), cache, chunk_size=1)
    return MemoryBuilder(ConstructionConfig(extractor="llm", consolidation="rule"), BagOfWordsEncoder(), llm=backend)


def test_killed_build_rerun_equals_uninterrupted_build(tmp_path):
    reference = _builder(_recorded, tmp_path / "ref.sqlite").build(_dialogue())

    calls = []

    def dies_after_three(messages):
        calls.append(1)
        if len(calls) > 3:
            raise _Killed()
        return _recorded(messages)

    with pytest.raises(_Killed):
        _builder(dies_after_three, tmp_path / "run.sqlite").build(_dialogue())
    rerun_builder = _builder(_recorded, tmp_path / "run.sqlite")
    rerun = rerun_builder.build(_dialogue())
    assert [u.to_dict() for u in rerun.units] == [u.to_dict() for u in reference.units]
    assert [t.to_dict() for t in rerun.traces] == [t.to_dict() for t in reference.traces]
    assert (rerun.embeddings == reference.embeddings).all() and len(reference.units) == 11
    stats = rerun_builder.stats
    assert stats.llm_cache_hits == 3 and stats.llm_calls == stats.windows - 3 and stats.llm_requests == stats.windows

    replay = _builder(lambda m: (_ for _ in ()).throw(AssertionError("no calls on replay")), tmp_path / "run.sqlite")
    again = replay.build(_dialogue())
    assert replay.stats.llm_calls == 0 and [u.id for u in again.units] == [u.id for u in reference.units]


def test_stats_accumulate_over_dialogues_and_meta_records_the_build():
    builder = MemoryBuilder(ConstructionConfig(), BagOfWordsEncoder())
    first = builder.build(make_dialogue([[("User", "I live in Boston."), ("Assistant", "Nice.")]], "a"))
    builder.build(make_dialogue([[("User", "I work at Acme Robotics."), ("User", "I have two cats.")]], "b"))
    stats = builder.stats.to_dict()
    assert (stats["dialogues"], stats["turns"], stats["windows"], stats["units"]) == (2, 4, 2, 3)
    assert stats["llm_calls"] == 0 and stats["seconds"] >= 0
    assert first.meta["extractor"] == "parser" and first.meta["llm"] is None
    assert first.meta["counts"]["units"] == 1 and first.meta["encoder"] == "test:bag-of-words"


@pytest.mark.parametrize("config", [ConstructionConfig(extractor="llm"), ConstructionConfig(consolidation="llm")])
def test_llm_settings_without_a_backend_are_rejected(config):
    with pytest.raises(ValueError, match="needs an LLM backend"):
        MemoryBuilder(config, BagOfWordsEncoder())


@pytest.mark.parametrize("extractor", ["llm", "heuristic"])
def test_extract_run_ahead_on_another_thread_then_build_equals_build(tmp_path, extractor):
    from concurrent.futures import ThreadPoolExecutor

    import numpy as np

    def builder():
        return MemoryBuilder(ConstructionConfig(extractor=extractor, consolidation="rule"), BagOfWordsEncoder(),
                             llm=CallableBackend(_recorded, "recorded"))

    whole, split = builder(), builder()
    reference = whole.build(_dialogue())
    with ThreadPoolExecutor(1) as ahead:  # the LLM part on a worker thread, as the cache build runs it
        extraction = ahead.submit(split.extract, _dialogue()).result()
    assert split.stats.dialogues == 0  # extraction alone records nothing
    store = split.build(_dialogue(), extraction)
    assert [u.to_dict() for u in store.units] == [u.to_dict() for u in reference.units]
    np.testing.assert_array_equal(store.embeddings, reference.embeddings)
    counts = {k: v for k, v in whole.stats.to_dict().items() if k != "seconds"}
    assert {k: v for k, v in split.stats.to_dict().items() if k != "seconds"} == counts
    assert counts["llm_requests"] == (counts["windows"] if extractor == "llm" else 0)
    with pytest.raises(ValueError, match="extraction of 'resume' given for dialogue 'other'"):
        split.build(make_dialogue([[("User", "Hi there.")]], dialogue_id="other"), extraction)

