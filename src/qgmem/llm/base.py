"""The one chat interface every LLM-driven step uses (construction, consolidation, later judging).

A backend takes a *batch* of conversations and returns one :class:`ChatResult` per conversation, in
order. A request that fails (timeout, HTTP error, junk body, generation error) comes back with ``error``
set instead of raising, so one bad request costs only the item that made it, never the whole batch.
"""

from __future__ import annotations

import threading
from abc import ABC, abstractmethod
from dataclasses import asdict, dataclass, field
from typing import Any

Message = dict[str, str]
Conversation = list[Message]


@dataclass
class ChatResult:
    """One reply. ``cached`` says it was replayed from a response cache without calling the model."""

    text: str
    prompt_tokens: int
    completion_tokens: int
    cached: bool = False
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None


@dataclass
class LLMConfig:
    """How to reach an LLM. The API key is never stored here: only the *name* of the env variable.

    ``backend``: ``"transformers"`` (a local causal LM folder, a hub id, or the embedded SmolLM2) or
    ``"openai"`` (any OpenAI-compatible ``/chat/completions`` server: vLLM, SGLang, Ollama, OpenAI).
    ``cache_path``: a SQLite file; when set, :func:`make_backend` wraps the backend in a replayable cache.
    """

    backend: str = "transformers"
    model: str = "embedded:SmolLM2-135M-Instruct"
    base_url: str = "http://127.0.0.1:8000/v1"
    api_key_env: str | None = "OPENAI_API_KEY"
    timeout_s: float = 120.0
    max_retries: int = 4
    backoff_s: float = 1.0
    max_backoff_s: float = 30.0
    max_concurrency: int = 8
    batch_size: int = 8
    device: str | None = None
    dtype: str = "auto"
    cache_path: str | None = None
    extra_body: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class Usage:
    """Counters a backend keeps across calls (thread-safe increments via :meth:`add`)."""

    requests: int = 0  # conversations asked for
    calls: int = 0  # conversations actually sent to the model (cache misses)
    cache_hits: int = 0
    errors: int = 0
    retries: int = 0
    prompt_tokens: int = 0  # tokens of calls actually made
    completion_tokens: int = 0

    def to_dict(self) -> dict[str, int]:
        return asdict(self)


class LLMBackend(ABC):
    """Batched chat completion. Subclasses implement :meth:`_chat`; :meth:`chat` keeps the counters."""

    name: str = "base"

    def __init__(self, model_id: str):
        self.model_id = model_id
        self.usage = Usage()
        self._lock = threading.Lock()

    def chat(self, conversations: list[Conversation], *, max_new_tokens: int = 512,
             temperature: float = 0.0) -> list[ChatResult]:
        """One result per conversation, same order; failures have ``error`` set, nothing raises."""
        if not conversations:
            return []
        results = self._chat(conversations, max_new_tokens=max_new_tokens, temperature=temperature)
        if len(results) != len(conversations):  # a backend bug, not a request failure
            raise RuntimeError(f"{self.name} returned {len(results)} results for {len(conversations)} requests")
        with self._lock:
            self.usage.requests += len(results)
            for r in results:
                if not r.cached:
                    self.usage.calls += 1
                    self.usage.prompt_tokens += r.prompt_tokens
                    self.usage.completion_tokens += r.completion_tokens
                else:
                    self.usage.cache_hits += 1
                self.usage.errors += r.error is not None
        return results

    @abstractmethod
    def _chat(self, conversations: list[Conversation], *, max_new_tokens: int,
              temperature: float) -> list[ChatResult]:
        ...

    def close(self) -> None:
        """Release connections or models; the default has nothing to release."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}(model_id={self.model_id!r})"
