"""The ``MemoryReconstruction`` stage's objective: graph tokens the frozen LM can read back as memory.

A frozen LM reading soft tokens needs a retention objective before the task loss: answer loss alone
does not make a token hold its input (xRAG, ICAE and ClipCap all pre-train the projector on
regenerating the text first). Here, for each training graph, the LM reads the ``K`` graph tokens and
the cue ``Memory [Mi]:`` and must produce entry ``i`` of the sample's textual working memory, for an
entry the compact prompt does not show as text (label ``> memory_units``; every entry when
``memory_units`` is ``None``). One entry per graph and step is drawn (seeded), its text cut to
:data:`MAX_TARGET_TOKENS`; the loss is the cross-entropy of those tokens only, with the LM frozen, so
the gradient reaches only the graph-token network. Self-supervised: no question or answer is read.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import torch

from qgmem.model.fusion import IGNORE_INDEX, answer_nll, insert_token
from qgmem.model.kv_prefix import reading
from qgmem.prompting.contract import memory_entries
from qgmem.training.alignment import run_stage, seeded_loader

MAX_TARGET_TOKENS = 48  # word pieces of an entry the LM must regenerate (an entry's fact and its metadata)
CUE = "Memory [M{label}]:"  # what the LM reads after the graph tokens


def hidden_entries(memory_text: str, memory_units: int | None) -> list[tuple[int, str]]:
    """The entries of ``memory_text`` the prompt's text leaves out (labels past ``memory_units``; all when
    ``None``), without empty ones."""
    return [(label, text) for label, text in memory_entries(memory_text)
            if text and (memory_units is None or label > memory_units)]


def pick_targets(memory_texts: Sequence[str], memory_units: int | None,
                 generator: torch.Generator) -> list[tuple[int, str] | None]:
    """One hidden entry per sample, drawn with ``generator`` (``None`` where a sample has none)."""
    picked: list[tuple[int, str] | None] = []
    for text in memory_texts:
        entries = hidden_entries(text, memory_units)
        picked.append(entries[int(torch.randint(len(entries), (1,), generator=generator))] if entries else None)
    return picked


class ReconstructionCollator:
    """``collator(items) -> batch``: the graphs of the items that have a hidden entry, and the cue + entry ids.

    ``graphs`` is the run's graph collation (:meth:`~qgmem.training.collate.GraphTextCollator.graphs`,
    which adds the node word pieces); the entry draw is seeded, so a stage's targets repeat with its seed.
    Returns ``None`` for a batch without any hidden entry.
    """

    def __init__(self, graphs: Callable[[list[dict[str, Any]]], dict[str, Any]], tokenizer, memory_units: int | None,
                 seed: int = 0, max_target_tokens: int = MAX_TARGET_TOKENS):
        self.graphs, self.tokenizer, self.memory_units = graphs, tokenizer, memory_units
        self.max_target_tokens = max_target_tokens
        self.generator = torch.Generator().manual_seed(seed)

    def _ids(self, text: str) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def __call__(self, items: list[dict[str, Any]]) -> dict[str, Any] | None:
        targets = pick_targets([item["memory_text"] for item in items], self.memory_units, self.generator)
        kept = [(item, target) for item, target in zip(items, targets) if target is not None]
        if not kept:
            return None
        rows = []
        for _, (label, text) in kept:
            cue, entry = self._ids(CUE.format(label=label)), self._ids(" " + text)[: self.max_target_tokens]
            rows.append((cue, entry))
        B, T = len(rows), max(len(cue) + len(entry) for cue, entry in rows)
        input_ids = torch.zeros((B, T), dtype=torch.long)  # padding is masked and never a label
        attention_mask = torch.zeros((B, T), dtype=torch.long)
        labels = torch.full((B, T), IGNORE_INDEX, dtype=torch.long)
        for b, (cue, entry) in enumerate(rows):
            n, m = len(cue), len(entry)
            input_ids[b, : n + m] = torch.tensor(cue + entry)
            attention_mask[b, : n + m] = 1
            labels[b, n : n + m] = torch.tensor(entry)
        return {**self.graphs([item for item, _ in kept]), "input_ids": input_ids, "attention_mask": attention_mask,
                "labels": labels, "targets": [target for _, target in kept]}


def reconstruction_loss(net: torch.nn.Module, lm, batch: dict[str, Any]) -> torch.Tensor:
    """Mean cross-entropy of the entries' tokens, the LM reading ``[K graph tokens] Memory [Mi]:``."""
    device = batch["input_ids"].device
    tokens = net(batch["graph"])
    embeds = lm.get_input_embeddings()(batch["input_ids"])
    start = torch.zeros(embeds.size(0), dtype=torch.long, device=device)  # the graph tokens come first
    embeds, mask, positions, labels = insert_token(embeds, batch["attention_mask"], start, tokens, batch["labels"])
    with reading(lm, tokens, start):  # a key/value prefix is read at every layer
        return answer_nll(lm, embeds, mask, positions, labels)


def reconstruct_memory(net: torch.nn.Module, lm, tokenizer, dataset: Sequence[dict[str, Any]], graphs: Callable, *,
                       memory_units: int | None, steps: int, batch_size: int = 32, lr: float = 3e-3, seed: int = 0,
                       device: torch.device | str = "cpu", progress: bool = False) -> dict[str, float]:
    """``steps`` Adam steps of :func:`reconstruction_loss` on ``net`` (in place; ``lm`` stays as it is).

    Batches are drawn from ``dataset`` in an order fixed by ``seed``; ``graphs`` is the run's graph
    collation. Returns the loss of the first and the last step (:func:`~qgmem.training.alignment.run_stage`).
    """
    if steps <= 0:
        return {}
    loader = seeded_loader(dataset, ReconstructionCollator(graphs, tokenizer, memory_units, seed=seed), batch_size, seed)

    def loss_of(batch: dict[str, Any] | None) -> torch.Tensor | None:
        if batch is None:
            return None
        moved = {k: v.to(device) if hasattr(v, "to") else v for k, v in batch.items()}
        return reconstruction_loss(net, lm, moved)

    return run_stage(net, loader, loss_of, steps=steps, lr=lr, what="memory reconstruction",
                     idle=f" (no sample has a memory entry past data.memory_units = {memory_units})", progress=progress)
