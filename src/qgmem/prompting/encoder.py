"""Tokenize the answer prompt exactly the way the frozen LM was chat-tuned to read it.

The prompt is the LM's chat template over :func:`~qgmem.prompting.contract.build_messages`. The graph
tokens' slot is the start of the user content, ahead of the textual working memory and the question; it
is found by tokenizing the rendered prompt in pieces (template head | memory | question | template
tail) rather than by searching token ids, so it is exact for any template.
"""

from __future__ import annotations

from dataclasses import dataclass

from qgmem.prompting.contract import PromptSettings, build_messages, first_entries, user_content

_MARK = "\u2063qgmem-slot\u2063"  # invisible separator around a word no template produces


@dataclass
class EncodedPrompt:
    """Prompt ids ending where the answer starts."""

    ids: list[int]
    graph_pos: int  # index of the first user-content token: the K graph tokens go right before it
    memory_tokens_dropped: int = 0
    overflow: int = 0  # tokens over max_prompt_tokens even with all memory text dropped (question too long)
    memory_tokens: int = 0  # tokens of the textual working memory kept in the prompt (retrieved context)


def _render(tokenizer, messages, generation_prompt: bool, enable_thinking: bool) -> str:
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=generation_prompt,
                                         enable_thinking=enable_thinking)


def end_of_turn_id(tokenizer, enable_thinking: bool = False) -> int:
    """The token that closes an assistant turn (``<|im_end|>``, ``<|eot_id|>``, ...); eos without a template."""
    if getattr(tokenizer, "chat_template", None):
        messages = [{"role": "user", "content": "x"}, {"role": "assistant", "content": _MARK}]
        rendered = _render(tokenizer, messages, False, enable_thinking)
        after = rendered.split(_MARK, 1)[1] if _MARK in rendered else ""
        ids = tokenizer(after.lstrip(" "), add_special_tokens=False)["input_ids"] if after.strip(" ") else []
        if ids:
            return ids[0]
    if tokenizer.eos_token_id is None:
        raise ValueError("the tokenizer has neither a chat template end-of-turn nor an eos token")
    return tokenizer.eos_token_id


def stop_token_ids(tokenizer, enable_thinking: bool = False) -> list[int]:
    """End of turn, then eos when it differs: generation stops at either."""
    ids = [end_of_turn_id(tokenizer, enable_thinking)]
    if tokenizer.eos_token_id is not None and tokenizer.eos_token_id not in ids:
        ids.append(tokenizer.eos_token_id)
    return ids


class PromptEncoder:
    """Tokenize (memory, question[, answer]) under one :class:`PromptSettings`."""

    def __init__(self, tokenizer, settings: PromptSettings | None = None):
        self.tokenizer = tokenizer
        self.settings = settings or PromptSettings()
        self.has_template = bool(getattr(tokenizer, "chat_template", None))
        self.head, self.tail = self._template_halves()
        self.head_ids = self._ids(self.head)
        self.tail_ids = self._ids(self.tail)
        self.eot_id = end_of_turn_id(tokenizer, self.settings.enable_thinking)
        self.stop_ids = stop_token_ids(tokenizer, self.settings.enable_thinking)
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id

    @property
    def max_prompt_tokens(self) -> int:
        return self.settings.max_prompt_tokens

    @property
    def max_answer_tokens(self) -> int:
        return self.settings.max_answer_tokens

    def _ids(self, text: str) -> list[int]:
        return self.tokenizer(text, add_special_tokens=False)["input_ids"] if text else []

    def _template_halves(self) -> tuple[str, str]:
        """Text before and after the user content in a rendered prompt (system prompt included)."""
        system = self.settings.system_prompt
        if not self.has_template:
            bos = self.tokenizer.bos_token or ""
            head = f"{bos}{system}\n\n" if system else bos
            return head, "\nAnswer: "
        messages = build_messages("", "", system)
        messages[-1]["content"] = _MARK
        rendered = _render(self.tokenizer, messages, True, self.settings.enable_thinking)
        if rendered.count(_MARK) != 1:
            raise ValueError("the tokenizer's chat template does not render the user content verbatim")
        head, tail = rendered.split(_MARK)
        return head, tail

    def prompt(self, memory_text: str, question: str) -> EncodedPrompt:
        """Prompt ids ending where the answer starts; the memory text is trimmed (from its end) to fit."""
        include = self.settings.include_memory_text
        memory_text = first_entries(memory_text, self.settings.memory_units)
        content = user_content(memory_text, question, include)
        memory = memory_text.strip() if include else ""
        split = content.find(memory) if memory else -1
        if split < 0:  # no memory text: nothing to trim
            before, memory, after = content, "", ""
        else:
            before, after = content[:split], content[split + len(memory):]
        fixed = self.head_ids + self._ids(before)
        after_ids = self._ids(after) + self.tail_ids
        memory_ids = self._ids(memory)
        budget = max(0, self.max_prompt_tokens - len(fixed) - len(after_ids))
        overflow = max(0, len(fixed) + len(after_ids) - self.max_prompt_tokens)
        dropped = max(0, len(memory_ids) - budget)
        if dropped:
            memory_ids = memory_ids[:budget]
        return EncodedPrompt(fixed + memory_ids + after_ids, len(self.head_ids), dropped, overflow, len(memory_ids))

    def answer(self, answer: str) -> list[int]:
        """Answer ids followed by the end-of-turn token (both are supervised)."""
        return self._ids(answer.strip())[: self.max_answer_tokens - 1] + [self.eot_id]
