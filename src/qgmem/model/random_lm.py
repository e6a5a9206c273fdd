"""Randomly initialized causal LMs built from a config, saved as a normal model folder.

Tests, benchmarks and GPU smoke runs need an LM with the real interface (tokenizer with a chat template,
``generate``, ``get_decoder``) but not its weights or its cost; a folder written here loads through the
same ``load_causal_lm(path)`` as a real checkpoint, so the code under test is the production path.
"""

from __future__ import annotations

from pathlib import Path

from qgmem.lm import EMBEDDED_LM, load_tokenizer

ARCHITECTURES = ("llama", "qwen3")

#: a chat template with Qwen3's thinking switch (an empty ``<think>`` block when ``enable_thinking`` is false),
#: written over SmolLM2's ChatML tokens, so a random Qwen3-architecture folder renders prompts as Qwen3 does
THINKING_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n"
    "{% if enable_thinking is defined and not enable_thinking %}<think>\n\n</think>\n\n{% endif %}{% endif %}"
)


def save_random_lm(out_dir: str | Path, arch: str = "llama", hidden_size: int = 64, layers: int = 2,
                   heads: int = 4, kv_heads: int = 2, intermediate_size: int | None = None,
                   tokenizer: str = EMBEDDED_LM, seed: int = 0, chat_template: str | None = None) -> Path:
    """Write a random ``arch`` model (with ``tokenizer``'s vocabulary and chat template) to ``out_dir``.

    ``chat_template`` replaces the tokenizer's (e.g. :data:`THINKING_TEMPLATE` for a Qwen3 stand-in).
    """
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig, Qwen3Config

    if arch not in ARCHITECTURES:
        raise ValueError(f"arch must be one of {ARCHITECTURES}, got {arch!r}")
    out = Path(out_dir)
    if (out / "config.json").exists() and any(out.glob("*.safetensors")):
        return out
    tok = load_tokenizer(tokenizer)
    if chat_template is not None:
        tok.chat_template = chat_template
    common = dict(vocab_size=len(tok), hidden_size=hidden_size, num_hidden_layers=layers,
                  num_attention_heads=heads, num_key_value_heads=kv_heads,
                  intermediate_size=intermediate_size or 4 * hidden_size, max_position_embeddings=4096,
                  bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
                  tie_word_embeddings=True)
    config = LlamaConfig(**common) if arch == "llama" else Qwen3Config(head_dim=hidden_size // heads, **common)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config)
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return out
