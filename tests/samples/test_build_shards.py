"""Sharded cache build: slices of the case plan, the merge, and a 2-process (gloo) run against 1 process."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from qgmem.lm import EMBEDDED_LM
from qgmem.samples import cache as C
from qgmem.samples.build import Shard, build_cache, build_on_ranks
from qgmem.training.build_cache import data_module
from qgmem.errors import UserError

from training.test_datamodule import HashEncoder, StubAnswerer, _dm, write_convomem

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("text, index, count", [("0/1", 0, 1), ("3/4", 3, 4), (" 1 / 2 ", 1, 2)])
def test_shard_parses_i_of_n(text, index, count):
    assert Shard.parse(text) == Shard(index, count) and str(Shard.parse(text)) == f"{index}/{count}"


@pytest.mark.parametrize("text", ["4/4", "1", "a/b", "-1/2", "0/0"])
def test_shard_rejects_bad_text(text):
    with pytest.raises(ValueError, match="shard must be"):
        Shard.parse(text)


@pytest.mark.parametrize("count", [1, 2, 3, 7])
def test_slices_cover_every_case_once(count):
    owners = [[s for s in range(count) if Shard(s, count).owns(i)] for i in range(20)]
    assert all(len(o) == 1 for o in owners)
    sizes = [sum(1 for o in owners if o == [s]) for s in range(count)]
    assert max(sizes) - min(sizes) <= 1


def rows_of(dataset_dir: Path) -> dict[str, list[dict]]:
    splits = C.DatasetCache(dataset_dir).load()
    return {name: [dict(r) for r in splits[name]] for name in C.SPLITS}


def assert_same_samples(a: dict[str, list[dict]], b: dict[str, list[dict]], atol: float = 0.0) -> None:
    """Sample for sample: same ids in the same order, same texts and edges; features equal within ``atol``."""
    assert {k: len(v) for k, v in a.items()} == {k: len(v) for k, v in b.items()}
    for name in C.SPLITS:
        for left, right in zip(a[name], b[name]):
            assert left.keys() == right.keys()
            for key in left:
                lv, rv = left[key], right[key]
                if key in ("x", "edge_attr"):  # float features
                    assert np.allclose(np.asarray(lv, np.float32), np.asarray(rv, np.float32), atol=atol), \
                        (name, left["qa_id"], key)
                else:
                    assert lv == rv, (name, left["qa_id"], key)


def test_slices_then_merge_equal_the_one_process_build(tmp_path):
    data = write_convomem(tmp_path / "convomem")
    whole = _dm(data, tmp_path / "whole")
    build_cache(whole, encoder=HashEncoder(), answerer=StubAnswerer(), progress=False)

    sharded = _dm(data, tmp_path / "sharded")
    first = build_cache(sharded, encoder=HashEncoder(), shard=Shard(0, 2), progress=False)
    assert first["complete"] is False and first["present"] == first["built"] < first["planned"]
    assert not C.SampleCache(sharded.samples_dir).complete
    again = build_cache(sharded, encoder=HashEncoder(), shard=Shard(0, 2), progress=False)
    assert again["built"] == 0  # a finished slice is reused
    second = build_cache(sharded, encoder=HashEncoder(), shard=Shard(1, 2), progress=False)
    assert C.SampleCache(sharded.samples_dir).complete  # the last slice wrote COMPLETE
    assert second["seconds"]["cases_built_this_run"] == first["planned"] - first["built"]
    build_cache(sharded, encoder=HashEncoder(), answerer=StubAnswerer(), progress=False)  # merge + filter
    assert sharded.cache_key == whole.cache_key
    assert_same_samples(rows_of(sharded.dataset_dir), rows_of(whole.dataset_dir))


def test_a_killed_slice_resumes_and_keeps_its_finished_cases(tmp_path):
    data = write_convomem(tmp_path / "convomem")
    dm = _dm(data, tmp_path / "cache")
    with pytest.raises(KeyboardInterrupt):
        build_cache(dm, encoder=HashEncoder(interrupt_after=60), shard=Shard(1, 2), progress=False)
    samples = C.SampleCache(dm.samples_dir)
    kept = [i for i in range(len(samples.plan())) if samples.has_shard(i)]
    assert kept and all(Shard(1, 2).owns(i) for i in kept)
    state = build_cache(dm, encoder=HashEncoder(), shard=Shard(1, 2), progress=False)
    assert state["present"] == state["built"] + len(kept) == sum(Shard(1, 2).owns(i) for i in range(state["planned"]))


def test_build_on_ranks_waits_and_only_rank_zero_filters(tmp_path):
    data = write_convomem(tmp_path / "convomem")
    dm = _dm(data, tmp_path / "cache")
    calls: list[bool] = []

    def any_rank(flag: bool) -> bool:  # one process stands for all: the collectives it joins, in order
        calls.append(flag)
        return flag

    # rank 1 of 2 alone: "anything to build?", its slice, the barrier after the slices and after the
    # merge (each carrying "did a rank fail?": no), no filtering (that is rank 0's)
    out = build_on_ranks(dm.cache_spec, 1, 2, any_rank=any_rank, encoder=HashEncoder(), progress=False)
    assert out is None and calls == [True, False, False]
    assert not C.DatasetCache(dm.dataset_dir).complete
    summary = build_on_ranks(dm.cache_spec, 0, 2, any_rank=any_rank, encoder=HashEncoder(), answerer=StubAnswerer(),
                             progress=False)
    assert C.DatasetCache(dm.dataset_dir).complete and summary["cache_key"] == dm.cache_key
    calls.clear()  # a complete dataset: no rank builds, nobody waits past the first question
    assert build_on_ranks(dm.cache_spec, 0, 2, any_rank=any_rank) is None
    assert calls == [False]


def test_a_rank_that_fails_its_step_stops_every_rank_instead_of_hanging_them(tmp_path, monkeypatch):
    """Rank 0's merge fails: rank 0 raises its own error, the other ranks (told through the collective
    that stands for the barrier) raise OtherRankFailed instead of waiting at it."""
    from qgmem.ranks import OtherRankFailed
    from qgmem.samples import build as cache_build

    data = write_convomem(tmp_path / "convomem")
    dm = _dm(data, tmp_path / "cache")

    def broken(*a, **k):
        raise OSError("disk full")

    monkeypatch.setattr(cache_build, "build_cache", broken)
    flags: list[bool] = []

    def rank0_any(flag: bool) -> bool:
        flags.append(flag)
        return flag

    with pytest.raises(OSError, match="disk full"):
        build_on_ranks(dm.cache_spec, 0, 2, any_rank=rank0_any, encoder=HashEncoder(), progress=False)
    assert flags == [True, False, True]  # the failure went into the collective the others wait in
    # rank 1's view: its own steps succeed, the collective after the merge reports rank 0's failure
    answers = iter([True, False, True])
    with pytest.raises(OtherRankFailed, match="merge on rank 0"):
        build_on_ranks(dm.cache_spec, 1, 2, any_rank=lambda flag: next(answers), encoder=HashEncoder(),
                       progress=False)
    # negative control: no rank failed, nobody raises
    answers = iter([True, False, False])
    assert build_on_ranks(dm.cache_spec, 1, 2, any_rank=lambda flag: next(answers), encoder=HashEncoder(),
                          progress=False) is None


def _config(tmp_path: Path, data: Path, cache: Path) -> Path:
    config = tmp_path / f"{cache.name}.yaml"
    config.write_text(
        f"model:\n  lm: {EMBEDDED_LM}\n"
        f"data:\n  data_path: {data}\n  cache_dir: {cache}\n  num_cases: null\n  distractor_conversations: 1\n"
        "  split_ratios: [0.5, 0.25, 0.25]\n  answer_filter: none\n  construction: {extractor: heuristic}\n",
        encoding="utf-8")
    return config


def test_config_data_section_makes_the_data_modules_spec(tmp_path):
    data = write_convomem(tmp_path / "convomem")
    config = _config(tmp_path, data, tmp_path / "cache")
    dm = data_module(["--config", str(config), "--data.num_cases", "3", "--data.construction.window_size", "4"])
    assert dm.cache_spec.num_cases == 3 and dm.cache_spec.construction.window_size == 4
    assert dm.cache_spec.construction.extractor == "heuristic" and dm.cache_spec.lm == EMBEDDED_LM
    # model.lm reaches data.lm through the training link, so the cache key names the run's LM
    assert data_module(["--config", str(config), "--model.lm", "some/other-lm"]).cache_spec.lm == "some/other-lm"
    with pytest.raises(SystemExit) as exit_info:  # the parser names the unknown key
        data_module(["--config", str(config), "--data.no_such_setting", "1"])
    assert exit_info.value.code == 2


def test_build_cache_prints_its_config_like_fit(tmp_path, capsys):
    from qgmem.cli import main

    data = write_convomem(tmp_path / "convomem")
    config = _config(tmp_path, data, tmp_path / "cache")
    assert main(["build-cache", "--config", str(config), "--data.num_cases", "2", "--print_config"]) == 0
    printed = capsys.readouterr().out
    assert "  num_cases: 2\n" in printed and f"  cache_dir: {tmp_path / 'cache'}\n" in printed
    assert "shard: null" in printed and not (tmp_path / "cache").exists()  # printed, nothing built
    assert main(["build-cache", "--config", str(config), "--data.no_such_setting", "1"]) == 2


def _cli(*args: str, nproc: int | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO / "src")}
    if nproc is None:
        cmd = [sys.executable, "-m", "qgmem", "build-cache", *args]
    else:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
               "-m", "qgmem.training.build_cache", *args]
    return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600, cwd=REPO)


@pytest.mark.slow
def test_two_gloo_processes_build_the_same_dataset_as_one(tmp_path):
    data = write_convomem(tmp_path / "convomem", persons=["p-ann", "p-bob", "p-cy"], items_per_person=2)
    one = _cli("--config", str(_config(tmp_path, data, tmp_path / "one")), "--no-progress")
    assert one.returncode == 0, one.stderr[-3000:]
    two = _cli("--config", str(_config(tmp_path, data, tmp_path / "two")), "--shard", "auto", "--no-progress",
               nproc=2)
    assert two.returncode == 0, two.stderr[-3000:]
    first, second = json.loads(one.stdout.strip().splitlines()[-1]), json.loads(two.stdout.strip().splitlines()[-1])
    assert first["complete"] and second["complete"]
    shards = [json.loads(p.read_text())["shard"]
              for p in sorted((tmp_path / "two").glob("samples-*/shards/*/meta.json"))]
    assert set(shards) == {"0/2", "1/2"}  # both ranks built cases
    # MiniLM embeds each text with the other texts of its batch: float noise only, never another sample
    assert_same_samples(rows_of(Path(second["dataset_dir"])), rows_of(Path(first["dataset_dir"])), atol=1e-5)


def test_cli_reports_a_bad_shard_as_a_user_error(tmp_path):
    data = write_convomem(tmp_path / "convomem")
    from qgmem.cli import main

    assert main(["build-cache", "--config", str(_config(tmp_path, data, tmp_path / "c")), "--shard", "2/2"]) == 2
    shutil.rmtree(tmp_path / "c", ignore_errors=True)


class FakeStrategy:
    def __init__(self):
        self.barriers: list[str] = []

    def barrier(self, name=None):
        self.barriers.append(name)

    def reduce_boolean_decision(self, decision, all=True):
        return decision


@pytest.mark.parametrize("per_node, expected", [(True, (1, 2)), (False, (3, 4))])
def test_data_module_shards_over_the_trainers_ranks(tmp_path, monkeypatch, per_node, expected):
    from types import SimpleNamespace

    from qgmem.samples import build as cache_build

    data = write_convomem(tmp_path / "convomem")
    dm = _dm(data, tmp_path / "cache", prepare_data_per_node=per_node)
    strategy = FakeStrategy()
    dm.trainer = SimpleNamespace(world_size=4, num_nodes=2, local_rank=1, global_rank=3, strategy=strategy)
    assert dm._cache_ranks() == expected
    seen = []
    monkeypatch.setattr(cache_build, "build_on_ranks", lambda spec, rank, world, **kw: seen.append((rank, world, kw)))
    dm.prepare_data()  # several processes: nothing here, setup builds
    assert not seen and not C.SampleCache(dm.samples_dir).root.exists()
    with pytest.raises(RuntimeError, match="no complete cache"):  # the stand-in built nothing
        dm.setup("fit")
    [(rank, world, kw)] = seen
    assert (rank, world) == expected and "barrier" not in kw and kw["any_rank"](True)
    dm.trainer = None
    assert dm._cache_ranks() is None
