"""The node-token alignment stage: before answer training, fit node tokens to the LM's word embeddings.

Like the feature-alignment stage of visual instruction tuning, it teaches the projector the LM's
input space before the answer loss is used, but here the target is known in closed form (the mean
word embedding of each node's text, :mod:`qgmem.model.alignment`), so the stage runs no LM forward
pass: a step is the graph encoder and projector over one batch of training graphs (0.2–0.3 s on 2 CPU
cores). It reads the training split only.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Sequence

import torch
from torch.utils.data import DataLoader

from qgmem.model.alignment import alignment_loss


def align_node_tokens(net: torch.nn.Module, dataset: Sequence[dict[str, Any]], collate: Callable, embedding: torch.Tensor,
                      *, steps: int, batch_size: int = 32, lr: float = 3e-3, seed: int = 0,
                      device: torch.device | str = "cpu") -> dict[str, float]:
    """``steps`` Adam steps of :func:`~qgmem.model.alignment.alignment_loss` on ``net`` (in place).

    Batches are drawn from ``dataset`` in an order fixed by ``seed`` (epochs repeat as needed) with
    ``collate`` (the run's collator, which puts ``node_word_ids`` on each graph). Returns the loss of the first and
    the last step; a non-finite loss stops the stage with an error naming the step.
    """
    if steps <= 0:
        return {}
    if len(dataset) == 0:
        raise ValueError("node-token alignment needs training samples, got an empty training split")
    generator = torch.Generator().manual_seed(seed)
    loader = DataLoader(dataset, batch_size=min(batch_size, len(dataset)), shuffle=True, collate_fn=collate,
                        generator=generator, drop_last=len(dataset) > batch_size)
    params = [p for p in net.parameters() if p.requires_grad]
    optimizer = torch.optim.Adam(params, lr=lr)
    was_training = net.training
    net.train()
    first = last = math.nan
    step = 0
    try:
        while step < steps:
            for batch in loader:
                graph = batch["graph"].to(device)
                if getattr(graph, "node_word_ids", None) is None:
                    raise ValueError("node-token alignment needs node texts in the samples (field 'node_text'); "
                                     "rebuild the data cache or set model.align_steps: 0")
                loss = alignment_loss(net.node_tokens(graph), graph.node_word_ids, embedding)
                if not torch.isfinite(loss):
                    raise FloatingPointError(f"non-finite node-token alignment loss at step {step}")
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                torch.nn.utils.clip_grad_norm_(params, 1.0)
                optimizer.step()
                last = loss.item()
                first = last if step == 0 else first
                step += 1
                if step >= steps:
                    break
    finally:
        net.train(was_training)
    return {"first_loss": first, "last_loss": last, "steps": step}
