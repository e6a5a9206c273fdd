"""Exact resume: sampler order and position, RNG states, and a SIGKILLed run resumed with ``--ckpt_path last``."""

from __future__ import annotations

import io
import json
import os
import random
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from qgmem.model.random_lm import save_random_lm
from qgmem.training.resume import (EpochRandomSampler, RandomStates, ResumableDataLoader, collect_rng_states,
                                   set_rng_states)
from qgmem.job import main

from .test_train_cli import TinyData

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]


def test_epoch_sampler_order_depends_on_seed_and_epoch_only():
    data = list(range(10))
    sampler = EpochRandomSampler(data, seed=3)
    first = list(sampler)
    torch.manual_seed(123)  # the global RNG plays no part
    assert list(sampler) == first and sorted(first) == data
    sampler.set_epoch(1)
    assert list(sampler) != first and sorted(sampler) == data
    assert list(EpochRandomSampler(data, seed=4)) != first


def loader(epoch: int = 0) -> ResumableDataLoader:
    sampler = EpochRandomSampler(list(range(7)), seed=0)
    sampler.set_epoch(epoch)
    return ResumableDataLoader(list(range(7)), batch_size=2, sampler=sampler)


def state_after(consumed: int, epoch: int = 0) -> dict:
    """The state of a loader of ``epoch`` that handed out ``consumed`` batches (as a checkpoint holds it)."""
    it = iter(source := loader(epoch))
    for _ in range(consumed):
        next(it)
    return source.state_dict()


@pytest.mark.parametrize("consumed", [0, 1, 3])
def test_loader_resumes_at_its_position_in_the_same_epoch(consumed):
    full = [b.tolist() for b in loader()]
    assert len(full) == 4
    resumed = loader()
    resumed.load_state_dict(state_after(consumed))
    assert [b.tolist() for b in resumed] == full[consumed:]
    assert [b.tolist() for b in resumed] == full  # the restored position applies to one iteration only


def test_loader_state_from_a_finished_epoch_does_not_skip_the_next():
    done = loader(epoch=0)
    assert len(list(done)) == 4
    nxt = loader(epoch=1)
    nxt.load_state_dict(done.state_dict())
    assert [b.tolist() for b in nxt] == [b.tolist() for b in loader(epoch=1)]


def test_loader_reads_the_epoch_at_the_first_batch_as_lightning_sets_it_after_iter():
    resumed = loader(epoch=0)
    resumed.load_state_dict(state_after(2, epoch=1))
    batches = iter(resumed)  # Lightning creates the iterator, then calls set_epoch, then fetches
    resumed.sampler.set_epoch(1)
    assert [b.tolist() for b in batches] == [b.tolist() for b in loader(epoch=1)][2:]
    assert [b.tolist() for b in loader(epoch=1)] != [b.tolist() for b in loader(epoch=0)]  # the epochs differ


def test_loader_resume_passes_over_indices_without_loading_their_samples():
    loaded = []

    class Recording(list):
        def __getitem__(self, i):
            loaded.append(i)
            return super().__getitem__(i)

    data = Recording(range(7))
    resumed = ResumableDataLoader(data, batch_size=2, sampler=EpochRandomSampler(data, seed=0))
    resumed.load_state_dict(state_after(3))
    assert [b.tolist() for b in resumed] == [b.tolist() for b in loader()][3:]
    assert len(loaded) == 1  # only the last batch's one sample was read, not the six passed over


def test_sampler_ranks_share_one_order_and_resume_alike():
    data = list(range(7))
    whole = list(EpochRandomSampler(data, seed=5))
    assert whole == torch.randperm(7, generator=torch.Generator().manual_seed(5)).tolist()  # as before: (seed, epoch)
    shares = [list(EpochRandomSampler(data, seed=5, num_replicas=2, rank=r)) for r in (0, 1)]
    assert shares[0] == (whole + whole[:1])[0::2] and shares[1] == (whole + whole[:1])[1::2]  # DistributedSampler's split
    part = EpochRandomSampler(data, seed=5, num_replicas=2, rank=1)
    it = iter(part)
    next(it), next(it)
    again = EpochRandomSampler(data, seed=5, num_replicas=2, rank=1)
    again.load_state_dict(part.state_dict())
    assert list(again) == shares[1][2:]


def test_loader_resumes_from_the_state_older_checkpoints_hold():
    """Checkpoints written before the torchdata loader hold ``{"epoch", "batches"}``; they resume alike."""
    resumed = loader(epoch=1)
    resumed.load_state_dict({"epoch": 1, "batches": 2})
    assert [b.tolist() for b in resumed] == [b.tolist() for b in loader(epoch=1)][2:]


def test_loader_resume_leaves_the_global_rng_where_it_was():
    state = state_after(2)
    torch.manual_seed(0)
    before = torch.get_rng_state()
    resumed = loader()
    resumed.load_state_dict(state)
    next(iter(resumed))
    assert torch.equal(torch.get_rng_state(), before)


def test_rng_states_round_trip_through_a_weights_only_checkpoint():
    torch.manual_seed(1), np.random.seed(2), random.seed(3)
    np.random.standard_normal()  # a cached Gaussian is part of numpy's state
    buffer = io.BytesIO()
    torch.save({"callbacks": {"RandomStates": RandomStates().state_dict()}}, buffer)
    expected = (torch.rand(3), np.random.standard_normal(3), [random.random() for _ in range(3)])
    buffer.seek(0)
    states = torch.load(buffer, weights_only=True)["callbacks"]["RandomStates"]
    torch.manual_seed(99), np.random.seed(99), random.seed(99)
    RandomStates().load_state_dict(states)
    assert torch.equal(torch.rand(3), expected[0])
    assert np.array_equal(np.random.standard_normal(3), expected[1])
    assert [random.random() for _ in range(3)] == expected[2]
    set_rng_states(collect_rng_states())  # idempotent
    assert isinstance(collect_rng_states()["torch"], torch.Tensor)


# --------------------------------------------------------------------------------------------------
# SIGKILL + --ckpt_path last against an uninterrupted run

MAX_STEPS = 8  # 6 training samples in batches of 2: 3 steps per epoch, so the run crosses two epochs


@pytest.fixture(scope="module")
def lm_path(tmp_path_factory):
    return str(save_random_lm(tmp_path_factory.mktemp("lm") / "tiny", hidden_size=32, layers=2))


def run_args(root: Path, lm_path: str) -> list[str]:
    config = root.parent / f"{root.name}.yaml"
    config.write_text(
        f"trainer:\n  accelerator: cpu\n  devices: 1\n  max_steps: {MAX_STEPS}\n  val_check_interval: 2\n"
        "  check_val_every_n_epoch: null\n  num_sanity_val_steps: 0\n  enable_progress_bar: false\n"
        "  enable_model_summary: false\n  log_every_n_steps: 1\n"
        "model:\n  encoder: {hidden: 16, heads: 2, layers: 2, dropout: 0.2}\n  generation: {max_new_tokens: 3}\n"
        "  features: text\n  readout: mean\n  num_graph_tokens: 1\n  stages: []\n"
        "lr_scheduler: {class_path: qgmem.training.schedule.WarmupCosine, init_args: {warmup_steps: 1}}\n")
    return ["--config", str(config), "--trainer.default_root_dir", str(root), "--model.lm", lm_path]


@pytest.fixture(scope="module")
def uninterrupted(lm_path, tmp_path_factory):
    root = tmp_path_factory.mktemp("uninterrupted") / "run"
    return main(run_args(root, lm_path), datamodule_class=TinyData), root


@pytest.mark.slow
@pytest.mark.parametrize("kill_at", [5, 7], ids=["mid-epoch", "after-epoch-end"])
def test_a_sigkilled_run_resumed_from_last_matches_the_uninterrupted_run(uninterrupted, lm_path, tmp_path, kill_at):
    reference, reference_root = uninterrupted
    root = tmp_path / "run"
    # the child computes the first steps and this process the rest: with another thread count their float
    # sums differ in the last bits, so the child gets this process's count, whatever set it
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "src"), os.environ.get("PYTHONPATH", "")]),
           "OMP_NUM_THREADS": str(torch.get_num_threads())}
    child = subprocess.run([sys.executable, str(HERE / "resume_child.py"), *run_args(root, lm_path),
                            "--trainer.callbacks+=__main__.KillAt", "--trainer.callbacks.init_args.step", str(kill_at)],
                           env=env, capture_output=True, text=True, timeout=600)
    assert child.returncode == -9, child.stderr[-2000:]  # SIGKILL: no cleanup, no final checkpoint
    last = torch.load(root / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)
    assert last["global_step"] == kill_at - 1 and not (root / "metrics.json").exists()

    resumed = main([*run_args(root, lm_path), "--ckpt_path", "last"], datamodule_class=TinyData)
    assert resumed["val"] == reference["val"] and resumed["test"] == reference["test"]
    assert resumed["best_score"] == reference["best_score"]
    final = torch.load(root / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)
    expected = torch.load(reference_root / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)
    assert final["global_step"] == expected["global_step"] == MAX_STEPS
    assert final["state_dict"].keys() == expected["state_dict"].keys()
    assert all(torch.equal(final["state_dict"][k], expected["state_dict"][k]) for k in expected["state_dict"])
    assert json.loads((root / "metrics.json").read_text())["val"] == reference["val"]
