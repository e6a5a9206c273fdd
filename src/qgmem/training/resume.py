"""Exact resume: a run killed at any step and resumed with ``--ckpt_path last`` repeats the uninterrupted run.

Lightning restores weights, optimizer, scheduler and loop counters, but not what decides *which* samples
come next and *which* dropout masks they get. Two pieces add that:

- :class:`EpochRandomSampler` shuffles with a generator seeded by ``(seed, epoch)`` only, as
  ``DistributedSampler`` does (and under DDP Lightning swaps it for one), instead of drawing each epoch's
  order from the global RNG at the moment the epoch starts.
- :class:`ResumableDataLoader` counts the batches it handed out this epoch and reports them through
  the ``state_dict`` / ``load_state_dict`` pair Lightning saves for a stateful train loader; after a
  restore, the next iteration of the same epoch passes over that many batches of the (same) order.
- :class:`RandomStates` saves the torch (CPU and CUDA), numpy and Python RNG states in the checkpoint and
  puts them back on resume, so dropout continues with the same draws.

Every state is plain ints, lists and tensors, so checkpoints still load with ``weights_only=True``. The
RNG states saved are rank 0's; every rank gets them back (exact when the ranks draw alike, as they do
from one ``seed_everything``). Workers (``num_workers > 0``) are reseeded from the restored RNG, which
only matters to a dataset or collator that draws random numbers (ours draw none).
"""

from __future__ import annotations

import random
from typing import Any, Iterator

import numpy as np
import torch
from lightning.pytorch.callbacks import Callback
from torch.utils.data import DataLoader, RandomSampler


class EpochRandomSampler(RandomSampler):
    """A random order that depends on ``(seed, epoch)`` only; Lightning calls ``set_epoch`` each epoch."""

    def __init__(self, data_source, seed: int = 0):
        super().__init__(data_source)
        self.seed, self.epoch = int(seed), 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = int(epoch)

    def __iter__(self) -> Iterator[int]:
        generator = torch.Generator().manual_seed(self.seed + self.epoch)
        yield from torch.randperm(len(self.data_source), generator=generator).tolist()


class ResumableDataLoader(DataLoader):
    """A ``DataLoader`` whose position within the epoch is part of the checkpoint.

    The state is ``{"epoch", "batches"}``: the sampler's epoch and the batches yielded in it. A restored
    state applies to the next iteration only if that iteration is of the same epoch (a checkpoint at an
    epoch's end resumes with the next epoch, from its start). The batches passed over are loaded and
    dropped, which keeps this exact under any sampler (the DDP one included) at the cost of reading them.
    """

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self._epoch: int | None = None
        self._yielded = 0
        self._restored: dict[str, Any] | None = None

    def _sampler_epoch(self) -> int | None:
        sampler = self.sampler if self.batch_sampler is None else getattr(self.batch_sampler, "sampler", self.sampler)
        epoch = getattr(sampler, "epoch", None)
        return None if epoch is None else int(epoch)

    def __iter__(self) -> Iterator[Any]:
        # a generator: the body runs at the first ``next``, after Lightning's ``set_epoch`` for this epoch
        epoch, restored, self._restored = self._sampler_epoch(), self._restored, None
        skip = int(restored["batches"]) if restored and restored.get("epoch") == epoch else 0
        self._epoch, self._yielded = epoch, 0
        rng = torch.get_rng_state() if skip else None
        iterator = super().__iter__()  # draws the workers' base seed from the global RNG ...
        if rng is not None:  # ... which the uninterrupted run did at the epoch's start, before the checkpoint
            torch.set_rng_state(rng)
        for index, batch in enumerate(iterator):
            self._yielded = index + 1
            if index >= skip:
                yield batch

    def state_dict(self) -> dict[str, Any]:
        epoch = self._epoch if self._epoch is not None else self._sampler_epoch()
        return {"epoch": epoch, "batches": self._yielded}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._restored = dict(state_dict)


def collect_rng_states() -> dict[str, Any]:
    """Torch (CPU, every CUDA device), numpy and Python RNG states as checkpoint-safe values."""
    kind, keys, pos, has_gauss, gauss = np.random.get_state()
    version, internal, gauss_next = random.getstate()
    states: dict[str, Any] = {
        "torch": torch.get_rng_state(),
        "numpy": {"kind": str(kind), "keys": torch.from_numpy(np.asarray(keys, dtype=np.int64)), "pos": int(pos),
                  "has_gauss": int(has_gauss), "gauss": float(gauss)},
        "python": {"version": int(version), "internal": list(internal), "gauss_next": gauss_next},
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        states["cuda"] = torch.cuda.get_rng_state_all()
    return states


def set_rng_states(states: dict[str, Any]) -> None:
    """Inverse of :func:`collect_rng_states` (CUDA states only when the device count matches)."""
    torch.set_rng_state(states["torch"].cpu())
    n = states["numpy"]
    np.random.set_state((n["kind"], n["keys"].numpy().astype(np.uint32), n["pos"], n["has_gauss"], n["gauss"]))
    p = states["python"]
    random.setstate((p["version"], tuple(p["internal"]), p["gauss_next"]))
    cuda = states.get("cuda")
    if cuda is not None and torch.cuda.is_available() and torch.cuda.device_count() == len(cuda):
        torch.cuda.set_rng_state_all([s.cpu() for s in cuda])


class RandomStates(Callback):
    """Checkpoint the RNG states (``state_dict``) and restore them when a fit resumes."""

    def state_dict(self) -> dict[str, Any]:
        return collect_rng_states()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        if state_dict:
            set_rng_states(state_dict)
