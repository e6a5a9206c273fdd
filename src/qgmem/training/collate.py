"""Turn dataset items into model batches: PyG graph batch + chat-formatted, label-masked token ids.

The prompt is the frozen LM's chat template over ``prompts.build_messages`` (for Qwen3 with thinking
disabled). The graph token's slot is the start of the user content, ahead of the textual working memory
and the question; it is found by tokenizing the rendered prompt in pieces (template head | memory |
question | template tail) rather than by searching token ids, so it is exact for any template.
Labels are set from piece lengths, never by comparing with the pad id (pad may equal end-of-turn).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch_geometric.data import Batch

from qgmem.training.prompts import GRAPH_ONLY_SYSTEM_PROMPT, SYSTEM_PROMPT, build_messages, user_content

IGNORE_INDEX = -100
_MARK = "\u2063qgmem-slot\u2063"  # invisible separator around a word no template produces


@dataclass
class EncodedPrompt:
    ids: list[int]
    graph_pos: int  # index of the first user-content token: the graph token goes right before it
    memory_tokens_dropped: int = 0


class PromptEncoder:
    """Tokenize (memory, question[, answer]) the way the frozen LM was chat-tuned to read them.

    ``with_memory_text=False`` (graph-only) drops the textual working memory and uses
    ``GRAPH_ONLY_SYSTEM_PROMPT`` in place of the default system prompt.
    """

    def __init__(self, tokenizer, max_prompt_tokens: int = 1024, max_answer_tokens: int = 64,
                 enable_thinking: bool = False, system_prompt: str | None = SYSTEM_PROMPT,
                 with_memory_text: bool = True):
        if max_answer_tokens < 1:
            raise ValueError(f"max_answer_tokens must be >= 1, got {max_answer_tokens}")
        self.tokenizer = tokenizer
        self.max_prompt_tokens = max_prompt_tokens
        self.max_answer_tokens = max_answer_tokens
        self.enable_thinking = enable_thinking
        if not with_memory_text and system_prompt == SYSTEM_PROMPT:  # the default one speaks of [M1] entries
            system_prompt = GRAPH_ONLY_SYSTEM_PROMPT
        self.system_prompt = system_prompt
        self.with_memory_text = with_memory_text  # False: graph-only prompts (no textual working memory)
        self.has_template = bool(getattr(tokenizer, "chat_template", None))
        self.head, self.tail = self._template_halves()
        self.head_ids = self._ids(self.head)
        self.tail_ids = self._ids(self.tail)
        self.eot_id = self._end_of_turn_id()
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id

    def _ids(self, text: str) -> list[int]:
        return self.tokenizer(text, add_special_tokens=False)["input_ids"] if text else []

    def _render(self, messages: list[dict[str, str]], generation_prompt: bool) -> str:
        return self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=generation_prompt,
                                                  enable_thinking=self.enable_thinking)

    def _template_halves(self) -> tuple[str, str]:
        """Text before and after the user content in a rendered prompt (system prompt included)."""
        if not self.has_template:
            bos = self.tokenizer.bos_token or ""
            head = f"{bos}{self.system_prompt}\n\n" if self.system_prompt else bos
            return head, "\nAnswer: "
        messages = build_messages("", "", self.system_prompt)
        messages[-1]["content"] = _MARK
        rendered = self._render(messages, generation_prompt=True)
        if rendered.count(_MARK) != 1:
            raise ValueError("the tokenizer's chat template does not render the user content verbatim")
        head, tail = rendered.split(_MARK)
        return head, tail

    def _end_of_turn_id(self) -> int:
        """The token that closes an assistant turn (``<|im_end|>``, ``<|eot_id|>``, ...); eos without a template."""
        if self.has_template:
            messages = build_messages("", "", self.system_prompt) + [{"role": "assistant", "content": _MARK}]
            rendered = self._render(messages, generation_prompt=False)
            after = rendered.split(_MARK, 1)[1] if _MARK in rendered else ""
            ids = self._ids(after.lstrip(" "))
            if ids:
                return ids[0]
        if self.tokenizer.eos_token_id is None:
            raise ValueError("the tokenizer has neither a chat template end-of-turn nor an eos token")
        return self.tokenizer.eos_token_id

    def prompt(self, memory_text: str, question: str) -> EncodedPrompt:
        """Prompt ids ending where the answer starts; the memory text is trimmed (from its end) to fit."""
        content = user_content(memory_text, question, self.with_memory_text)
        memory = memory_text.strip() if self.with_memory_text else ""
        split = content.find(memory) if memory else -1
        if split < 0:  # no memory text: nothing to trim
            before, memory, after = content, "", ""
        else:
            before, after = content[:split], content[split + len(memory):]
        fixed = self.head_ids + self._ids(before)
        after_ids = self._ids(after) + self.tail_ids
        memory_ids = self._ids(memory)
        budget = max(0, self.max_prompt_tokens - len(fixed) - len(after_ids))
        dropped = max(0, len(memory_ids) - budget)
        if dropped:
            memory_ids = memory_ids[:budget]
        return EncodedPrompt(fixed + memory_ids + after_ids, len(self.head_ids), dropped)

    def answer(self, answer: str) -> list[int]:
        """Answer ids followed by the end-of-turn token (both are supervised)."""
        return self._ids(answer.strip())[: self.max_answer_tokens - 1] + [self.eot_id]


class GraphTextCollator:
    """``collator(items) -> batch`` for :class:`qgmem.training.module.QGMemModule` (see the data contract)."""

    def __init__(self, tokenizer, max_prompt_tokens: int = 1024, max_answer_tokens: int = 64,
                 enable_thinking: bool = False, system_prompt: str | None = SYSTEM_PROMPT,
                 with_memory_text: bool = True):
        self.encoder = PromptEncoder(tokenizer, max_prompt_tokens, max_answer_tokens, enable_thinking, system_prompt,
                                     with_memory_text)

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
        gen_graph_pos = graph_pos + torch.tensor([Tg - len(p.ids) for p in prompts], dtype=torch.long)
        return {
            "graph": Batch.from_data_list([item["graph"] for item in items]),
            "input_ids": input_ids, "attention_mask": attention_mask, "labels": labels, "graph_pos": graph_pos,
            "gen_input_ids": gen_ids, "gen_attention_mask": gen_mask, "gen_graph_pos": gen_graph_pos,
            "qa_id": [str(item.get("qa_id", i)) for i, item in enumerate(items)],
            "question": [item["question"] for item in items],
            "answer": [item["answer"] for item in items],
            "category": [str(item.get("category", "")) for item in items],
            "memory_tokens_dropped": torch.tensor([p.memory_tokens_dropped for p in prompts], dtype=torch.long),
        }
