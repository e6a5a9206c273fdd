"""LLM-backed cache build with several cases in flight against one OpenAI-compatible server.

The server is a 127.0.0.1 stub that answers each construction prompt with one unit per user turn
(deterministic per prompt), fails one window with HTTP 400 and answers another with prose that never
validates, and records how many requests it holds at once. The build with cases in flight must equal
the build one case after another, sample for sample, while keeping more requests in flight than one
case has windows, never more than the backend's ``max_concurrency``.
"""

from __future__ import annotations

import re
import threading
import time

import pytest

from qgmem.llm.base import LLMConfig
from qgmem.memory.config import ConstructionConfig
from qgmem.memory.windows import make_windows
from qgmem.samples import cache as C
from qgmem.samples.build import CasesAhead, Replayer, build_cache, plan_cases

from llm.helpers import StubServer, completion  # tests/llm, importable as "llm" under pytest
from memory.test_builder import _recorded
from .test_build_shards import assert_same_samples, rows_of
from training.test_datamodule import HashEncoder, StubAnswerer, _dm, write_convomem

MAX_CONCURRENCY = 6


class CountingServer(StubServer):
    """The stub server, answering after ``delay_s`` and counting the requests it holds at once."""

    def __init__(self, delay_s: float = 0.08):
        self.active = self.peak = 0
        lock = threading.Lock()

        def respond(request):
            with lock:
                self.active += 1
                self.peak = max(self.peak, self.active)
            try:
                time.sleep(delay_s)
                prompt = request["messages"][1]["content"]
                if "blue invoice" in prompt:  # a window the server refuses: skipped, never retried
                    return 400, "bad request"
                if "amber meeting" in prompt:  # never valid JSON: retried once, then skipped
                    return completion("Sorry, no JSON today.")
                return completion(_recorded(request["messages"]), 50, 10)
            finally:
                with lock:
                    self.active -= 1

        super().__init__(respond)


def _llm_dm(data, cache, url: str, in_flight: int | None, cache_path=None, **kw):
    llm = LLMConfig(backend="openai", model="stub", base_url=url, max_concurrency=MAX_CONCURRENCY, max_retries=0,
                    timeout_s=10, deadline_s=30, cache_path=None if cache_path is None else str(cache_path))
    return _dm(data, cache, construction=ConstructionConfig(extractor="llm", consolidation="rule"),
               construction_llm=llm, construction_cases_in_flight=in_flight, answer_filter="none", **kw)


def _windows_per_case(dm) -> int:
    plan, _ = plan_cases(dm.cache_spec)
    c = dm.cache_spec.construction
    return max(len(make_windows(case.dialogue, c.window_size, c.window_overlap)) for _, case in plan)


@pytest.mark.parametrize("response_cache", [False, True])
def test_cases_in_flight_equal_the_serial_build_and_fill_the_bound(tmp_path, response_cache):
    data = write_convomem(tmp_path / "convomem")
    with CountingServer() as server:
        serial = _llm_dm(data, tmp_path / "serial", server.url, 1,
                         tmp_path / "serial.sqlite" if response_cache else None)
        build_cache(serial, encoder=HashEncoder(), answerer=StubAnswerer(), progress=False)
        serial_requests, serial_peak = len(server.requests), server.peak
        server.peak = 0
        ahead = _llm_dm(data, tmp_path / "ahead", server.url, 4, tmp_path / "ahead.sqlite" if response_cache else None)
        summary = build_cache(ahead, encoder=HashEncoder(), answerer=StubAnswerer(), progress=False)
        ahead_requests, ahead_peak = len(server.requests) - serial_requests, server.peak
    windows = _windows_per_case(serial)
    assert ahead.cache_key == serial.cache_key  # how the build runs is in no key
    assert_same_samples(rows_of(ahead.dataset_dir), rows_of(serial.dataset_dir))
    assert summary["seconds"]["cases_in_flight"] == 4
    # the windows the server refused or answered with prose are counted in the build's summary, per reason
    construction = summary["construction"]
    plan = C.SampleCache(ahead.samples_dir).plan()
    assert construction["cases"] == len(plan) and construction["windows"] >= len(plan)
    refused = sum("blue invoice" in r["messages"][1]["content"] for r in server.requests[serial_requests:])
    assert construction["skipped_windows"] == sum(construction["skip_reasons"].values()) >= 2
    assert set(construction["skip_reasons"]) == {"llm_error", "invalid_reply"} and refused >= 1
    assert construction["retried_windows"] >= 1
    assert serial_peak <= windows < ahead_peak <= MAX_CONCURRENCY
    # with a response cache, a prompt shared by cases in flight is asked once, as in the serial build
    assert ahead_requests == serial_requests
    if response_cache:
        assert serial_requests < len(C.SampleCache(ahead.samples_dir).plan()) * windows


def test_the_default_keeps_max_concurrency_cases_in_flight_and_local_models_refuse_more(tmp_path):
    data = write_convomem(tmp_path / "convomem")
    dm = _llm_dm(data, tmp_path / "c", "http://127.0.0.1:9/v1", None)
    assert Replayer(dm.cache_spec, HashEncoder()).cases_in_flight == MAX_CONCURRENCY
    assert Replayer(_dm(data, tmp_path / "d").cache_spec, HashEncoder()).cases_in_flight == 1  # no LLM: serial
    with pytest.raises(ValueError, match="construction_cases_in_flight=4 needs an OpenAI-compatible server"):
        _dm(data, tmp_path / "e", construction_llm=LLMConfig(backend="transformers"), construction_cases_in_flight=4)
    with pytest.raises(ValueError, match="construction_cases_in_flight must be >= 1"):
        _llm_dm(data, tmp_path / "f", "http://127.0.0.1:9/v1", 0)


class _Down(Exception):
    pass


@pytest.mark.parametrize("strict", [True, False])
def test_a_case_that_fails_ahead_fails_at_its_own_turn_and_the_build_resumes(tmp_path, monkeypatch, strict):
    data = write_convomem(tmp_path / "convomem")
    with CountingServer(delay_s=0.02) as server:
        serial = _llm_dm(data, tmp_path / "serial", server.url, 1)
        build_cache(serial, encoder=HashEncoder(), answerer=StubAnswerer(), progress=False)
        dm = _llm_dm(data, tmp_path / "ahead", server.url, 3, strict=strict)
        plan, _ = plan_cases(dm.cache_spec)
        bad = plan[4][1].id
        extract = Replayer.extract

        def fails_on_bad(self, case):
            if case.id == bad:
                raise _Down("server went away")
            return extract(self, case)

        monkeypatch.setattr(Replayer, "extract", fails_on_bad)
        samples = C.SampleCache(dm.samples_dir)
        expected = rows_of(serial.dataset_dir)
        if strict:
            with pytest.raises(RuntimeError, match=re.escape(f"case 4 ({bad!r}, split ") + r"\w+\): .*_Down: server went away"):
                build_cache(dm, encoder=HashEncoder(), answerer=StubAnswerer(), progress=False)
            # the cases before it are written, none after it (those in flight were dropped)
            assert [samples.has_shard(i) for i in range(len(plan))] == [True] * 4 + [False] * (len(plan) - 4)
            monkeypatch.setattr(Replayer, "extract", extract)
            build_cache(dm, encoder=HashEncoder(), answerer=StubAnswerer(), progress=False)  # resumes
        else:
            build_cache(dm, encoder=HashEncoder(), answerer=StubAnswerer(), progress=False)
            assert samples.shard_meta(4)["skipped"] == "_Down: server went away"
            expected = {name: [r for r in rows if r["case_id"] != bad] for name, rows in expected.items()}
    assert_same_samples(rows_of(dm.dataset_dir), expected)


def test_cases_ahead_hands_out_extractions_in_plan_order_and_bounds_them():
    started, running, peak, lock = [], [0], [0], threading.Lock()

    class Slow:
        def extract(self, case):
            with lock:
                started.append(case)
                running[0] += 1
                peak[0] = max(peak[0], running[0])
            time.sleep(0.02 * (5 - case % 5))  # later cases finish first
            with lock:
                running[0] -= 1
            return f"units of {case}"

    plan = [("train", i) for i in range(10)]
    ahead = CasesAhead(Slow(), plan, list(range(1, 10)), width=3)
    got = [ahead.extraction(i) for i in range(1, 10)]
    ahead.close()
    assert got == [f"units of {i}" for i in range(1, 10)] and sorted(started) == list(range(1, 10))
    assert peak[0] == 3
    assert CasesAhead(Slow(), plan, [0], width=1).extraction(0) is None  # width 1: the case extracts itself


def test_a_window_lost_to_an_outage_is_never_stored_and_the_resumed_build_is_whole(tmp_path):
    """A window that got no reply at all (the server down, retries spent) keeps its case out of the cache, even
    far below the share of failed windows a dialogue may lose; the build after the outage equals a healthy one."""
    data = write_convomem(tmp_path / "convomem")
    healthy = lambda request: completion(_recorded(request["messages"]))  # noqa: E731
    with StubServer(healthy) as server:
        reference = _llm_dm(data, tmp_path / "reference", server.url, 1)
        build_cache(reference, encoder=HashEncoder(), answerer=StubAnswerer(), progress=False)

    def down_for_one_window(request):
        return (503, "overloaded") if "amber meeting" in request["messages"][1]["content"] else healthy(request)

    with StubServer(down_for_one_window) as server:
        dm = _llm_dm(data, tmp_path / "cache", server.url, 1)
        with pytest.raises(RuntimeError, match="got no reply from the LLM server; the case is not stored"):
            build_cache(dm, encoder=HashEncoder(), answerer=StubAnswerer(), progress=False)
    with StubServer(healthy) as server:
        dm = _llm_dm(data, tmp_path / "cache", server.url, 1)
        summary = build_cache(dm, encoder=HashEncoder(), answerer=StubAnswerer(), progress=False)
    assert summary["construction"]["unavailable_windows"] == 0
    assert_same_samples(rows_of(dm.dataset_dir), rows_of(reference.dataset_dir))
