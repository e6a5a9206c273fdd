"""The pre-training loop: before answer training, teach the graph-token network the LM's input space.

Two training stages (:mod:`qgmem.training.stages`) pre-train with it (:func:`run_stage`):

- ``NodeWordAlignment``: fit node tokens to the LM's word embeddings. Like the feature-alignment stage of visual
  instruction tuning, it teaches the projector the LM's input space before the answer loss is used, but
  the target is known in closed form (the mean word embedding of each node's text,
  :mod:`qgmem.model.alignment`), so the stage runs no LM forward pass: a step is the graph encoder and
  projector over one batch of training graphs (0.2–0.3 s on 2 CPU cores).
- ``MemoryReconstruction``: the frozen LM regenerates working-memory entries from the graph tokens alone
  (:mod:`qgmem.training.reconstruction`).

Either reads the training split only.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Iterable, Sequence

import torch
from torch.utils.data import DataLoader

from qgmem.model.alignment import alignment_loss


def seeded_loader(dataset: Sequence[dict[str, Any]], collate: Callable, batch_size: int, seed: int) -> DataLoader:
    """Batches of ``dataset`` in an order fixed by ``seed`` (full batches when there is more than one)."""
    if len(dataset) == 0:
        raise ValueError("the pre-training stage needs training samples, got an empty training split")
    generator = torch.Generator().manual_seed(seed)
    return DataLoader(dataset, batch_size=min(batch_size, len(dataset)), shuffle=True, collate_fn=collate,
                      generator=generator, drop_last=len(dataset) > batch_size)


def run_stage(net: torch.nn.Module, loader: Iterable[Any], loss_of: Callable[[Any], torch.Tensor | None], *,
              steps: int, lr: float, what: str, idle: str = "", progress: bool = False) -> dict[str, float]:
    """``steps`` Adam steps of ``loss_of(batch)`` on ``net``'s trainable parameters (in place), epochs of
    ``loader`` repeated as needed; a batch whose loss is ``None`` has nothing to learn and is skipped.

    Gradients go into ``net`` only (a LoRA adapter on the LM gets none). Returns the loss of the first
    and the last step; a non-finite loss stops the stage with an error naming ``what`` and the step, and
    a whole pass without a step with one naming ``what`` and ``idle`` (why a batch can have nothing).
    ``progress``: a bar of the steps done out of ``steps``, with the last loss (rank 0 of a run shows it).
    """
    from tqdm.auto import tqdm

    params = [p for p in net.parameters() if p.requires_grad]
    optimizer = torch.optim.Adam(params, lr=lr)
    was_training = net.training
    net.train()
    first = last = math.nan
    step = 0
    bar = tqdm(total=steps, desc=what, unit="step", disable=not progress, mininterval=10.0)
    try:
        while step < steps:
            stepped = False
            for batch in loader:
                loss = loss_of(batch)
                if loss is None:
                    continue
                if not torch.isfinite(loss):
                    raise FloatingPointError(f"non-finite {what} loss at step {step}")
                optimizer.zero_grad(set_to_none=True)
                loss.backward(inputs=params)
                torch.nn.utils.clip_grad_norm_(params, 1.0)
                optimizer.step()
                last = loss.item()
                first = last if step == 0 else first
                step, stepped = step + 1, True
                bar.update(1)
                bar.set_postfix(loss=f"{last:.3f}", refresh=False)
                if step >= steps:
                    break
            if not stepped:
                raise ValueError(f"{what}: no batch of the training split had anything to learn{idle}")
    finally:
        bar.close()
        net.train(was_training)
    return {"first_loss": first, "last_loss": last, "steps": step}


def align_node_tokens(net: torch.nn.Module, dataset: Sequence[dict[str, Any]], collate: Callable, embedding: torch.Tensor,
                      *, steps: int, batch_size: int = 32, lr: float = 3e-3, seed: int = 0,
                      device: torch.device | str = "cpu", progress: bool = False) -> dict[str, float]:
    """``steps`` Adam steps of :func:`~qgmem.model.alignment.alignment_loss` on ``net`` (in place).

    Batches are drawn from ``dataset`` in an order fixed by ``seed`` (epochs repeat as needed) with
    ``collate`` (the run's collator, which puts ``node_word_ids`` on each graph). Returns the loss of the first and
    the last step; a non-finite loss stops the stage with an error naming the step.
    """
    if steps <= 0:
        return {}
    loader = seeded_loader(dataset, collate, batch_size, seed)

    def loss_of(batch: dict[str, Any]) -> torch.Tensor:
        graph = batch["graph"].to(device)
        if getattr(graph, "node_word_ids", None) is None:
            raise ValueError("node-token alignment needs node texts in the samples (field 'node_text'); "
                             "rebuild the data cache or leave NodeWordAlignment out of model.stages")
        return alignment_loss(net.node_tokens(graph), graph.node_word_ids, embedding)

    return run_stage(net, loader, loss_of, steps=steps, lr=lr, what="node-token alignment", progress=progress)
