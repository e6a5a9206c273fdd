"""Exact resume: a run killed at any step and resumed with ``--ckpt_path last`` repeats the uninterrupted run.

Lightning restores weights, optimizer, scheduler and loop counters, but not what decides *which* samples
come next and *which* dropout masks they get. Two pieces add that:

- :class:`EpochRandomSampler` shuffles with a generator seeded by ``(seed, epoch)`` only (it is a
  ``DistributedSampler``, this rank's share), instead of drawing each epoch's order from the global RNG
  at the moment the epoch starts, and saves how many indices it gave out this epoch.
- :class:`ResumableDataLoader` is torchdata's ``StatefulDataLoader``: Lightning saves its state (the
  sampler's among it) for a stateful train loader, and after a restore the next iteration of the same
  epoch passes over the indices already used, without loading their samples.
- :class:`RandomStates` saves the torch (CPU and CUDA), numpy and Python RNG states in the checkpoint and
  puts them back on resume, so dropout continues with the same draws.

Every state is plain ints, lists and tensors, so checkpoints still load with ``weights_only=True``. The
RNG states saved are rank 0's; every rank gets them back (exact when the ranks draw alike, as they do
from one ``seed_everything``). Workers (``num_workers > 0``) are reseeded from the restored RNG, which
only matters to a dataset or collator that draws random numbers (ours draw none).
"""

from __future__ import annotations

import random
from itertools import islice
from typing import Any, Iterator

import numpy as np
import torch
from lightning.pytorch.callbacks import Callback
from torch.utils.data import DistributedSampler
from torchdata.stateful_dataloader import StatefulDataLoader


class EpochRandomSampler(DistributedSampler):
    """This rank's share of a random order that depends on ``(seed, epoch)`` only, with its position saved.

    It is a ``DistributedSampler`` (one replica by default), so under DDP Lightning keeps it instead of
    wrapping it; Lightning calls ``set_epoch`` each epoch. ``state_dict`` / ``load_state_dict`` hold
    ``{"epoch", "yielded"}``: a restored position applies to the next iteration if it is of the same epoch
    (a state saved at an epoch's end starts the next epoch from its start). The order is drawn at the
    first index, not when the iterator is made, because Lightning makes the train iterator of a resumed
    run before it sets the epoch.
    """

    def __init__(self, data_source, seed: int = 0, num_replicas: int = 1, rank: int = 0):
        super().__init__(data_source, num_replicas=num_replicas, rank=rank, shuffle=True, seed=int(seed))
        self.data_source = data_source
        self._yielded = 0
        self._restored: dict[str, int] | None = None

    def __iter__(self) -> Iterator[int]:
        restored, self._restored = self._restored, None
        skip = int(restored["yielded"]) if restored and restored.get("epoch") == self.epoch else 0
        self._yielded = skip
        for index in islice(super().__iter__(), skip, None):
            self._yielded += 1
            yield index

    def state_dict(self) -> dict[str, int]:
        return {"epoch": int(self.epoch), "yielded": self._yielded}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._restored = {"epoch": int(state_dict["epoch"]), "yielded": int(state_dict["yielded"])}


class ResumableDataLoader(StatefulDataLoader):
    """torchdata's ``StatefulDataLoader``: its position in the epoch is part of the checkpoint.

    Lightning saves its ``state_dict`` for a stateful train loader and restores it on resume. With
    :class:`EpochRandomSampler` the restored iteration passes over the indices already used without
    loading their samples. Making the restored iterator draws the workers' base seed from the global RNG,
    which the uninterrupted run did at the epoch's start, before the checkpoint; that draw is undone so
    dropout continues as it would have.
    """

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        if set(state_dict) == {"epoch", "batches"}:  # a checkpoint of qgmem <= 0.1's own loader: batches of the epoch
            self.sampler.load_state_dict({"epoch": state_dict["epoch"],
                                          "yielded": int(state_dict["batches"]) * int(self.batch_size or 1)})
            return
        super().load_state_dict(state_dict)

    def __iter__(self):
        restoring = getattr(self, "next_iter_state", None) is not None
        rng = torch.get_rng_state() if restoring else None
        iterator = super().__iter__()
        if rng is not None:
            torch.set_rng_state(rng)
        return iterator


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
