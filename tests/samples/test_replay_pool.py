"""The cache build's replay on worker processes (``cache_processes``) against the serial build."""

from __future__ import annotations

import os

import pytest

from qgmem.llm.base import LLMConfig
from qgmem.samples import cache as C
from qgmem.samples.build import Shard, build_cache, build_samples
from qgmem.samples.replay_pool import THREAD_VARIABLES, WorkerFailed, _thread_environment
from qgmem.samples.spec import CacheSpec

from samples.test_build_shards import assert_same_samples, rows_of
from training.test_datamodule import HashEncoder, StubAnswerer, _dm, write_convomem


class DyingEncoder(HashEncoder):
    """Ends its process, as the kernel's OOM killer would, when it meets ``word``."""

    def __init__(self, word: str):
        super().__init__()
        self.word = word

    def encode(self, texts):
        if any(self.word in t for t in texts):
            os._exit(9)
        return super().encode(texts)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return write_convomem(tmp_path_factory.mktemp("pool") / "convomem")


def test_two_processes_build_the_serial_dataset(data, tmp_path):
    serial = _dm(data, tmp_path / "serial", answer_filter="none")
    one = build_cache(serial, encoder=HashEncoder(), answerer=StubAnswerer(), progress=False)
    pooled = _dm(data, tmp_path / "pooled", answer_filter="none", cache_processes=2)
    two = build_cache(pooled, encoder=HashEncoder(), answerer=StubAnswerer(), progress=False)
    assert pooled.cache_key == serial.cache_key  # how the build runs is in no key
    assert one["seconds"]["processes"] == 1 and two["seconds"]["processes"] == 2
    assert two["seconds"]["cases_built_this_run"] == one["seconds"]["cases_built_this_run"] == len(
        C.SampleCache(pooled.samples_dir).plan())
    # both workers' memo counts are added up: every distinct text was encoded by one of them at least
    assert two["seconds"]["embedding_memo"]["encoded"] >= one["seconds"]["embedding_memo"]["encoded"] > 0
    assert_same_samples(rows_of(pooled.dataset_dir), rows_of(serial.dataset_dir))


@pytest.mark.slow  # worker processes that each start torch: minutes on a busy 2-core machine
def test_every_case_is_reported_once_as_its_shard_is_written(data, tmp_path, monkeypatch):
    from qgmem.samples import replay_pool

    spec = _dm(data, tmp_path / "c", answer_filter="none").cache_spec
    samples = C.SampleCache(spec.samples_dir)
    seen, original = [], replay_pool.replay_in_processes

    def spy(*args, **kwargs):
        def on_case(index):
            assert samples.has_shard(index)  # each case is reported after its shard was written
            seen.append(index)
            kwargs["on_case"](index)

        return original(*args, **{**kwargs, "on_case": on_case})

    monkeypatch.setattr(replay_pool, "replay_in_processes", spy)
    done = build_samples(spec, samples, encoder=HashEncoder(), progress=False, processes=3)
    planned = len(samples.plan())
    assert sorted(seen) == list(range(planned)) and done["seconds"]["processes"] == 3
    assert samples.complete and not samples.damaged_shards(planned)


@pytest.mark.slow  # worker processes that each start torch: minutes on a busy 2-core machine
def test_more_processes_than_cases_left_use_one_per_case(data, tmp_path):
    spec = _dm(data, tmp_path / "c", answer_filter="none", cache_processes=4).cache_spec
    samples = C.SampleCache(spec.samples_dir)
    first = build_samples(spec, samples, encoder=HashEncoder(), progress=False, shard=Shard(0, 2), processes=1)
    missing = first["planned"] - first["present"]
    samples.remove_shard(0)  # one more of the first slice to do again
    again = build_samples(spec, samples, encoder=HashEncoder(), progress=False, shard=Shard(1, 2))
    assert again["complete"] is False and again["built"] == missing and again["processes"] == min(4, missing)
    assert not samples.complete and not samples.has_shard(0)
    last = build_samples(spec, samples, encoder=HashEncoder(), progress=False)
    assert last["seconds"]["cases_built_this_run"] == 1 and last["seconds"]["processes"] == 1
    assert samples.complete


@pytest.mark.slow  # worker processes that each start torch: minutes on a busy 2-core machine
def test_a_failed_case_stops_a_strict_build_by_name_and_keeps_the_written_shards(data, tmp_path):
    dm = _dm(data, tmp_path / "strict", answer_filter="none", cache_processes=2)
    with pytest.raises(WorkerFailed, match=r"case \d+ \('.*p-bob.*'.*construction/activation failed: "
                                           r"RuntimeError: cannot encode 'p-bob'") as failed:
        build_cache(dm, encoder=HashEncoder(explode_on="p-bob"), answerer=StubAnswerer(), progress=False)
    samples = C.SampleCache(dm.samples_dir)
    plan = samples.plan()
    assert not samples.complete
    written = [i for i in range(len(plan)) if samples.has_shard(i)]
    # the named case has no shard, nor has any of p-bob's evidence questions (they name p-bob); the
    # worker that failed had written the cases it took before (which others were done depends on timing)
    assert not samples.has_shard(int(str(failed.value).split()[1]))
    assert not [i for i in written if "user_evidence" in plan[i]["case_id"] and "p-bob" in plan[i]["case_id"]]
    assert written
    # a rerun with a working encoder goes on from the shards that exist
    summary = build_cache(dm, encoder=HashEncoder(), answerer=StubAnswerer(), progress=False)
    assert summary["seconds"]["cases_built_this_run"] == len(plan) - len(written)


@pytest.mark.slow  # worker processes that each start torch: minutes on a busy 2-core machine
def test_a_lenient_build_counts_the_failed_cases_as_skipped(tmp_path):
    data = write_convomem(tmp_path / "data")
    file = next(data.rglob("p-cy_Tester.json"))
    file.write_text(file.read_text().replace("Dana", "Zorblax"))
    dm = _dm(data, tmp_path / "lenient", answer_filter="none", strict=False, cache_processes=2)
    summary = build_cache(dm, encoder=HashEncoder(explode_on="Zorblax"), answerer=StubAnswerer(), progress=False)
    skipped = summary["skipped_cases"]
    assert skipped and all("p-cy" in s["case_id"] and "Zorblax" in s["reason"] for s in skipped)
    assert sum(len(v) for v in summary["samples"].values()) > 0  # the other persons' cases were built


@pytest.mark.slow  # worker processes that each start torch: minutes on a busy 2-core machine
def test_a_worker_that_dies_stops_the_build_with_its_exit_code(data, tmp_path):
    dm = _dm(data, tmp_path / "dies", answer_filter="none", cache_processes=2)
    with pytest.raises(WorkerFailed, match="exit code 9 before it finished"):
        build_cache(dm, encoder=DyingEncoder("p-cy"), answerer=StubAnswerer(), progress=False)
    assert not C.SampleCache(dm.samples_dir).complete


def test_workers_get_their_share_of_threads_and_the_environment_is_restored(monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "7")
    monkeypatch.delenv("MKL_NUM_THREADS", raising=False)
    with _thread_environment(1):
        assert all(os.environ[name] == "1" for name in THREAD_VARIABLES)
    assert os.environ["OMP_NUM_THREADS"] == "7" and "MKL_NUM_THREADS" not in os.environ


def test_bad_process_counts_are_refused(data, tmp_path):
    with pytest.raises(ValueError, match="cache_processes must be >= 1"):
        CacheSpec(data_path=str(data), cache_dir=tmp_path, cache_processes=0)
    with pytest.raises(ValueError, match="would load construction_llm once per process"):
        CacheSpec(data_path=str(data), cache_dir=tmp_path, cache_processes=2,
                  construction_llm=LLMConfig(backend="transformers"))


class NoModels:
    """A worker's replayer stand-in: no models, no memo."""

    memo = None

    def close(self):
        pass


def no_models(spec, encoder):
    return NoModels()


def replay_noting_the_worker(replayer, samples, plan, index, shard):
    """Writes which worker replayed the case; case 0 is slow, so a free worker would take the rest."""
    import multiprocessing
    import time
    from pathlib import Path

    if index == 0:
        time.sleep(1.5)
    Path(samples.root, f"case-{index}.worker").write_text(multiprocessing.current_process().name)


def test_each_worker_replays_a_fixed_share_of_the_cases_whatever_their_speed(tmp_path):
    # the same cases go to the same worker every run, so each worker's encoder meets the same texts in
    # the same batches and the vectors do not depend on timing (a shared queue gave worker 1 all the
    # cases that came while case 0 was slow: this test failed with it)
    from qgmem.samples.replay_pool import replay_in_processes

    samples = C.SampleCache(tmp_path / "samples")
    samples.root.mkdir(parents=True, exist_ok=True)
    todo = [0, 1, 2, 3, 4, 5]
    seen = []
    replay_in_processes(None, samples, {i: None for i in todo}, todo, 2, None, replayer=no_models,
                        replay=replay_noting_the_worker, on_case=seen.append)
    assert sorted(seen) == todo
    workers = {i: (samples.root / f"case-{i}.worker").read_text() for i in todo}
    assert workers == {i: f"qgmem-cache-{position % 2}" for position, i in enumerate(todo)}


SCRIPT = '''
from qgmem.samples.replay_pool import replay_in_processes


class Samples:
    root = "."


class Replayer:
    memo = None

    def close(self):
        pass


def make_replayer(spec, encoder):
    return Replayer()


def replay(replayer, samples, plan, index, shard):
    pass


def build():
    plan = [("case", "x" * 100_000)] * 4  # more than a pipe holds: a job queue that nobody reads stays full
    print(replay_in_processes(None, Samples(), plan, range(4), 2, None, replayer=make_replayer, replay=replay))
'''


@pytest.mark.parametrize("guarded", [True, False])
def test_a_script_without_a_main_guard_stops_with_a_message_not_a_hang(tmp_path, guarded):
    """A spawned worker imports the main module: unguarded, it runs the build again and fails there.

    Before the job queues' feeders were released, that worker hung at exit on its full queues and the
    parent polled it for ever. The guarded script is the positive control: the same build finishes."""
    import subprocess
    import sys

    script = tmp_path / "build_script.py"
    script.write_text(SCRIPT + ('if __name__ == "__main__":\n    build()\n' if guarded else "build()\n"))
    done = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=240)
    if guarded:
        assert done.returncode == 0, done.stderr
        assert "'encoded': 0" in done.stdout
    else:
        assert done.returncode == 1
        assert "exit code 1 before it finished" in done.stderr and '__name__ == "__main__"' in done.stderr
