"""The LLM backends behind one interface, and :func:`make_backend` to build one from an :class:`LLMConfig`.

```python
backend = make_backend(LLMConfig(backend="openai", base_url="http://localhost:8000/v1",
                                 model="Qwen/Qwen3-8B", cache_path="llm_cache.sqlite"))
[reply] = backend.chat([[{"role": "user", "content": "Hi"}]], max_new_tokens=64)
```
"""

from __future__ import annotations

from collections.abc import Callable

from qgmem.llm.base import ChatResult, Conversation, LLMBackend, LLMConfig, Usage
from qgmem.llm.cache import CachedBackend
from qgmem.llm.http import OpenAIChatBackend
from qgmem.llm.local import TransformersChatBackend

__all__ = [
    "CallableBackend", "CachedBackend", "ChatResult", "Conversation", "LLMBackend", "LLMConfig",
    "OpenAIChatBackend", "SERVER_BACKENDS", "TransformersChatBackend", "Usage", "make_backend",
]

#: ``LLMConfig.backend`` names of an OpenAI-compatible server (served by :class:`OpenAIChatBackend`)
SERVER_BACKENDS = ("openai", "http", "vllm", "sglang", "ollama")


class CallableBackend(LLMBackend):
    """A backend answered by a Python function ``messages -> text`` (recorded replies, rule-based stubs).

    Token counts are whitespace word counts unless ``count_tokens`` is given. An exception from the
    function becomes that item's ``error``, like a failed HTTP request would.
    """

    name = "callable"

    def __init__(self, fn: Callable[[Conversation], str], model_id: str = "callable",
                 count_tokens: Callable[[str], int] | None = None):
        super().__init__(model_id)
        self.fn = fn
        self.count_tokens = count_tokens or (lambda text: len(text.split()))

    def _chat(self, conversations: list[Conversation], *, max_new_tokens: int,
              temperature: float) -> list[ChatResult]:
        results = []
        for messages in conversations:
            prompt = sum(self.count_tokens(m["content"]) for m in messages)
            try:
                text = self.fn(messages)
            except Exception as e:  # noqa: BLE001 - reported per item, like any backend failure
                results.append(ChatResult("", prompt, 0, error=f"{type(e).__name__}: {e}"))
            else:
                results.append(ChatResult(text, prompt, self.count_tokens(text)))
        return results


def make_backend(config: LLMConfig) -> LLMBackend:
    """Build the configured backend, wrapped in :class:`CachedBackend` when ``cache_path`` is set."""
    kind = config.backend.lower()
    if kind in SERVER_BACKENDS:
        backend: LLMBackend = OpenAIChatBackend(config)
    elif kind in ("transformers", "local", "hf"):
        backend = TransformersChatBackend(config)
    else:
        raise ValueError(f"unknown LLM backend {config.backend!r}: use 'openai' or 'transformers'")
    return CachedBackend(backend, config.cache_path) if config.cache_path else backend
