"""Turn dataset items into model batches: PyG graph batch + chat-formatted, label-masked token ids.

Prompts come from :class:`qgmem.prompting.PromptEncoder` under the run's one
:class:`~qgmem.prompting.PromptSettings` (the same contract the answer filter, evaluation and serving
use). Labels are set from piece lengths, never by comparing with the pad id (pad may equal end-of-turn).
"""

from __future__ import annotations

import copy
from dataclasses import replace
from typing import Any

import torch
from torch_geometric.data import Batch

from qgmem.model.alignment import node_word_ids
from qgmem.prompting import PromptEncoder, PromptSettings

IGNORE_INDEX = -100
WORD_MEMO_SIZE = 4096  # graphs whose node word pieces a collator keeps


class GraphTextCollator:
    """``collator(items) -> batch`` for :class:`qgmem.training.module.QGMemModule` (see the data contract)."""

    def __init__(self, tokenizer, settings: PromptSettings | None = None, **overrides: Any):
        """``overrides`` replace single fields of ``settings`` (e.g. ``max_prompt_tokens=96`` in tests)."""
        settings = replace(settings or PromptSettings(), **overrides)
        self.encoder = PromptEncoder(tokenizer, settings)
        # a graph's node word pieces, memoized (a plain dict, so the collator still pickles for loader
        # workers): the alignment stage collates the same graphs every step
        self._word_memo: dict[tuple[tuple[str, ...], int], torch.Tensor] = {}

    def __call__(self, items: list[dict[str, Any]]) -> dict[str, Any]:
        if not items:
            raise ValueError("cannot collate an empty list of items")
        prompts, answers = [], []
        for i, item in enumerate(items):
            for key in ("graph", "memory_text", "question", "answer"):
                if key not in item:
                    raise KeyError(f"item {i} (qa_id {item.get('qa_id', '?')!r}) has no field {key!r}")
            prompts.append(self.encoder.prompt(item["memory_text"], item["question"]))
            answers.append(self.encoder.answer(item["answer"]))
        pad = self.encoder.pad_id
        B = len(items)
        T = max(len(p.ids) + len(a) for p, a in zip(prompts, answers))
        input_ids = torch.full((B, T), pad, dtype=torch.long)
        attention_mask = torch.zeros((B, T), dtype=torch.long)
        labels = torch.full((B, T), IGNORE_INDEX, dtype=torch.long)
        Tg = max(len(p.ids) for p in prompts)
        gen_ids = torch.full((B, Tg), pad, dtype=torch.long)
        gen_mask = torch.zeros((B, Tg), dtype=torch.long)
        for b, (p, a) in enumerate(zip(prompts, answers)):
            n, m = len(p.ids), len(a)
            input_ids[b, : n + m] = torch.tensor(p.ids + a)
            attention_mask[b, : n + m] = 1
            labels[b, n : n + m] = torch.tensor(a)
            gen_ids[b, Tg - n :] = torch.tensor(p.ids)
            gen_mask[b, Tg - n :] = 1
        graph_pos = torch.tensor([p.graph_pos for p in prompts], dtype=torch.long)
        graphs = [self._with_words(item) for item in items]
        gen_graph_pos = graph_pos + torch.tensor([Tg - len(p.ids) for p in prompts], dtype=torch.long)
        return {
            "graph": Batch.from_data_list(graphs),
            "input_ids": input_ids, "attention_mask": attention_mask, "labels": labels, "graph_pos": graph_pos,
            "gen_input_ids": gen_ids, "gen_attention_mask": gen_mask, "gen_graph_pos": gen_graph_pos,
            "qa_id": [str(item.get("qa_id", i)) for i, item in enumerate(items)],
            "question": [item["question"] for item in items],
            "answer": [item["answer"] for item in items],
            "category": [str(item.get("category", "")) for item in items],
            "memory_tokens_dropped": torch.tensor([p.memory_tokens_dropped for p in prompts], dtype=torch.long),
        }

    def _with_words(self, item: dict[str, Any]):
        """The item's graph with ``node_word_ids`` (its node texts' word pieces, read by the ``node_words``
        features and the node-token alignment) when the item carries ``node_text``; a shallow copy, so
        the ids travel with the graph wherever it is paired (the shuffled ablation)."""
        graph = item["graph"]
        if "node_text" not in item:
            return graph
        graph = copy.copy(graph)
        key = (tuple(item["node_text"]), int(graph.num_nodes))
        if key not in self._word_memo:
            if len(self._word_memo) >= WORD_MEMO_SIZE:
                self._word_memo.clear()
            self._word_memo[key] = node_word_ids([key[0]], [key[1]], self.encoder.tokenizer)
        graph.node_word_ids = self._word_memo[key]
        return graph

    def graphs(self, items: list[dict[str, Any]]) -> dict[str, Any]:
        """The graph part of ``self(items)`` alone (``{"graph": Batch}``), for stages that read no prompt
        (the node-token alignment); it skips the prompts' tokenization."""
        if not items:
            raise ValueError("cannot collate an empty list of items")
        return {"graph": Batch.from_data_list([self._with_words(item) for item in items])}
