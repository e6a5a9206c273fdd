from __future__ import annotations

import pytest
import torch

from qgmem.llm.backends import LLMConfig, TransformersChatBackend


@pytest.fixture(scope="module")
def tiny_backend(smollm2_tokenizer):
    """A tiny random Llama with SmolLM2's tokenizer and chat template (no real weights needed)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=len(smollm2_tokenizer), hidden_size=32, intermediate_size=64,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=512, pad_token_id=smollm2_tokenizer.pad_token_id,
                         eos_token_id=smollm2_tokenizer.eos_token_id)
    model = LlamaForCausalLM(config).eval()
    return TransformersChatBackend(LLMConfig(model="tiny-random", batch_size=2), model=model,
                                   tokenizer=smollm2_tokenizer)


PROMPTS = [[{"role": "user", "content": "Hi"}],
           [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "A much longer question here?"}],
           [{"role": "user", "content": "Third one"}]]


def test_batched_greedy_matches_one_by_one(tiny_backend):
    batched = tiny_backend.chat(PROMPTS, max_new_tokens=6)
    single = [tiny_backend.chat([p], max_new_tokens=6)[0] for p in PROMPTS]
    assert [r.text for r in batched] == [r.text for r in single]  # left padding does not change outputs
    assert all(1 <= r.completion_tokens <= 6 and r.error is None for r in batched)
    expected_prompt = [len(tiny_backend.tokenizer(tiny_backend.render(p), add_special_tokens=False)["input_ids"])
                       for p in PROMPTS]
    assert [r.prompt_tokens for r in batched] == expected_prompt
    assert tiny_backend.tokenizer.padding_side == "left"


def test_callers_tokenizer_is_left_as_it_was(tiny_backend, smollm2_tokenizer):
    # the fixture's tokenizer is shared (session scope, right padding); the backend pads its own copy
    assert smollm2_tokenizer.padding_side == "right"
    assert tiny_backend.tokenizer is not smollm2_tokenizer
    left = type(smollm2_tokenizer).from_pretrained(smollm2_tokenizer.name_or_path, padding_side="left")
    backend = TransformersChatBackend(LLMConfig(model="tiny-random"), model=tiny_backend.model, tokenizer=left)
    assert backend.tokenizer is left  # already left-padded with a pad token: no copy needed


def test_generation_failure_is_an_error_per_item(tiny_backend, monkeypatch):
    def boom(*args, **kwargs):
        raise RuntimeError("out of memory")

    monkeypatch.setattr(tiny_backend.model, "generate", boom)
    results = tiny_backend.chat(PROMPTS, max_new_tokens=4)
    assert [r.error for r in results] == ["generation failed: RuntimeError: out of memory"] * 3
