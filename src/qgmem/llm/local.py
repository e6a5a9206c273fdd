"""A local transformers causal LM as a chat backend: batched, left-padded, greedy at temperature 0.

Loads from a folder, a hub id (with a network or warm hub cache), or ``embedded:SmolLM2-135M-Instruct``
through :mod:`qgmem.lm`. Prompts are rendered with the tokenizer's chat template; left padding keeps
every prompt's last token at the same position so one call of the shared generation helper
(:func:`qgmem.prompting.generate`) serves the whole batch.
"""

from __future__ import annotations

import copy

from qgmem.llm.base import ChatResult, Conversation, LLMBackend, LLMConfig


class TransformersChatBackend(LLMBackend):
    name = "transformers"

    def __init__(self, config: LLMConfig, model=None, tokenizer=None):
        super().__init__(config.model)
        from qgmem.lm import load_causal_lm, load_tokenizer

        self.config = config
        self.chunk_size = max(1, config.batch_size)
        if tokenizer is None:
            tokenizer = load_tokenizer(config.model, padding_side="left")
        elif tokenizer.padding_side != "left" or tokenizer.pad_token is None:
            tokenizer = copy.deepcopy(tokenizer)  # the caller's tokenizer (shared with training, say) stays as it was
        self.tokenizer = tokenizer
        self.tokenizer.padding_side = "left"
        if self.tokenizer.pad_token is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        self.model = model if model is not None else load_causal_lm(config.model, dtype=config.dtype,
                                                                    device=config.device)

    def render(self, messages: Conversation) -> str:
        return self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)

    def _chat(self, conversations: list[Conversation], *, max_new_tokens: int,
              temperature: float) -> list[ChatResult]:
        results: list[ChatResult] = []
        for start in range(0, len(conversations), self.config.batch_size):
            batch = conversations[start:start + self.config.batch_size]
            try:
                results.extend(self._generate(batch, max_new_tokens, temperature))
            except Exception as e:  # noqa: BLE001 - one failed batch must not end the build
                results.extend(ChatResult("", 0, 0, error=f"generation failed: {type(e).__name__}: {e}")
                               for _ in batch)
        return results

    def _generate(self, batch: list[Conversation], max_new_tokens: int, temperature: float) -> list[ChatResult]:
        from qgmem.prompting import generate, stop_token_ids

        prompts = [self.render(m) for m in batch]
        enc = self.tokenizer(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
        out = generate(self.model, self.tokenizer, enc["attention_mask"], input_ids=enc["input_ids"],
                       max_new_tokens=int(max_new_tokens), stop_ids=self._stop_ids(stop_token_ids),
                       pad_id=self.tokenizer.pad_token_id, temperature=temperature)
        prompt_tokens = enc["attention_mask"].sum(dim=1).tolist()
        return [ChatResult(text, int(n_prompt), n_new)
                for text, n_prompt, n_new in zip(out.texts, prompt_tokens, out.num_tokens)]

    def _stop_ids(self, stop_token_ids) -> list[int]:
        """End of turn, eos and pad: a finished row is padded, so pad ends a reply too."""
        ids = stop_token_ids(self.tokenizer)
        if self.tokenizer.pad_token_id is not None and self.tokenizer.pad_token_id not in ids:
            ids.append(self.tokenizer.pad_token_id)
        return ids
