"""The one chat interface every LLM-driven step uses (construction, consolidation, later judging).

A backend takes a *batch* of conversations and returns one :class:`ChatResult` per conversation, in
order. A request that fails (timeout, HTTP error, junk body, generation error) comes back with ``error``
set instead of raising, so one bad request costs only the item that made it, never the whole batch.

An empty reply (nothing but whitespace or ``<think>`` reasoning) is a failure too, and so is a reply
that the caller's ``validate`` rejects (``chat(..., validate=parse_reply)``): both come back with
``error`` set and ``unusable=True`` (the text is kept, for a retry prompt that quotes it) and are
counted in ``usage.unusable``. The response cache never stores an empty reply; a rejected one it keeps,
marked, only at temperature 0 (see :mod:`qgmem.llm.cache`).
"""

from __future__ import annotations

import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from qgmem.lm import EMBEDDED_LM
from qgmem.llm.parsing import strip_reasoning

Message = dict[str, str]
Conversation = list[Message]
#: ``validate(text)`` raises (any ``Exception``) when a reply cannot be used; its return value is ignored
Validator = Callable[[str], Any]
#: one validator for the whole batch, or one (or ``None``) per conversation
Validators = Validator | Sequence[Validator | None] | None


def per_item(validate: Validators, n: int) -> list[Validator | None]:
    """``validate`` spread over ``n`` conversations (a sequence must have one entry per conversation)."""
    if validate is None or callable(validate):
        return [validate] * n
    validators = list(validate)
    if len(validators) != n:
        raise ValueError(f"{len(validators)} validators for {n} conversations")
    return validators


@dataclass
class ChatResult:
    """One reply. ``cached`` says it was replayed from a response cache without calling the model."""

    text: str
    prompt_tokens: int
    completion_tokens: int
    cached: bool = False
    error: str | None = None
    unusable: bool = False  # a reply arrived but was empty or failed validation (``text`` holds it)
    #: no reply at all: the server could not be reached, or kept failing until the retries or the deadline were
    #: spent (an outage, not an answer about this request; a refused request, e.g. HTTP 400, is not this)
    unavailable: bool = False
    #: the request ran out of time (a read timeout on the last attempt, or the overall deadline)
    timed_out: bool = False
    #: why the reply ended, as the server says (``stop`` | ``length``), when it says
    finish_reason: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None


@dataclass
class LLMConfig:
    """How to reach an LLM. The API key is never stored here: only the *name* of the env variable.

    ``backend``: ``"transformers"`` (a local causal LM folder, a hub id, or the embedded SmolLM2) or
    ``"openai"`` (any OpenAI-compatible ``/chat/completions`` server: vLLM, SGLang, Ollama, OpenAI).
    ``cache_path``: a SQLite file; when set, :func:`make_backend` wraps the backend in a replayable cache.
    ``timeout_s`` bounds each network read; ``deadline_s`` bounds a whole request, retries and backoff
    included, so a server that trickles bytes cannot hold a call for longer.
    """

    backend: str = "transformers"
    model: str = EMBEDDED_LM
    base_url: str = "http://127.0.0.1:8000/v1"
    api_key_env: str | None = "OPENAI_API_KEY"
    timeout_s: float = 120.0
    deadline_s: float = 600.0
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
    unusable: int = 0  # replies that were empty or failed the caller's validation (among ``errors``)
    retries: int = 0
    prompt_tokens: int = 0  # tokens of calls actually made
    completion_tokens: int = 0

    def to_dict(self) -> dict[str, int]:
        return asdict(self)


class LLMBackend(ABC):
    """Batched chat completion. Subclasses implement :meth:`_chat`; :meth:`chat` keeps the counters."""

    name: str = "base"

    #: whether several threads may call :meth:`chat` at once and be served concurrently (an HTTP server
    #: is; a local model answers one batch at a time, so callers would only queue behind it)
    concurrent_callers: bool = False

    def __init__(self, model_id: str):
        self.model_id = model_id
        self.usage = Usage()
        self._lock = threading.Lock()
        self._thread_usage = threading.local()

    def usage_here(self) -> Usage:
        """The counters of the calls made from the calling thread alone.

        Several threads may share one backend (cases replayed side by side against one server); each
        takes its own before/after difference from this rather than from :attr:`usage`, which counts all.
        """
        usage = getattr(self._thread_usage, "usage", None)
        if usage is None:
            usage = self._thread_usage.usage = Usage()
        return usage

    def chat(self, conversations: list[Conversation], *, max_new_tokens: int = 512,
             temperature: float = 0.0, validate: Validators = None) -> list[ChatResult]:
        """One result per conversation, same order; failures have ``error`` set, nothing raises.

        ``validate(text)`` (optional; or a list, one per conversation) raises when a reply is unusable
        (e.g. the JSON parser of the step that asked); such replies, and empty ones, come back as
        failures (see the module docstring).
        """
        if not conversations:
            return []
        validate = per_item(validate, len(conversations))
        results = self._chat_checked(conversations, max_new_tokens=max_new_tokens, temperature=temperature,
                                     validate=validate)
        if len(results) != len(conversations):  # a backend bug, not a request failure
            raise RuntimeError(f"{self.name} returned {len(results)} results for {len(conversations)} requests")
        with self._lock:
            _count_results(self.usage, results)
        _count_results(self.usage_here(), results)
        return results

    def _chat_checked(self, conversations: list[Conversation], *, max_new_tokens: int, temperature: float,
                      validate: list[Validator | None]) -> list[ChatResult]:
        """:meth:`_chat`, then every successful reply checked with :func:`check_reply`."""
        results = self._chat(conversations, max_new_tokens=max_new_tokens, temperature=temperature)
        if len(results) != len(conversations):
            return results  # reported as a backend bug by chat()
        return [check_reply(r, v) for r, v in zip(results, validate)]

    @abstractmethod
    def _chat(self, conversations: list[Conversation], *, max_new_tokens: int,
              temperature: float) -> list[ChatResult]:
        ...

    def close(self) -> None:
        """Release connections or models; the default has nothing to release."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}(model_id={self.model_id!r})"


def _count_results(usage: Usage, results: list[ChatResult]) -> None:
    usage.requests += len(results)
    for r in results:
        if not r.cached:
            usage.calls += 1
            usage.prompt_tokens += r.prompt_tokens
            usage.completion_tokens += r.completion_tokens
        else:
            usage.cache_hits += 1
        usage.errors += r.error is not None
        usage.unusable += r.unusable


def reply_problem(text: str, validate: Validator | None = None) -> str | None:
    """Why ``text`` cannot be used (empty, only reasoning, or rejected by ``validate``), or ``None``."""
    if not strip_reasoning(text).strip():
        return "empty reply" if not text.strip() else "empty reply (only reasoning)"
    if validate is not None:
        try:
            validate(text)
        except Exception as exc:  # noqa: BLE001 - any failure of the caller's check makes the reply unusable
            return f"unusable reply ({type(exc).__name__}: {str(exc)[:200]})"
    return None


def check_reply(result: ChatResult, validate: Validator | None = None) -> ChatResult:
    """``result`` marked as a failure (``error`` set, ``unusable=True``, text kept) when unusable."""
    if result.error is not None:
        return result
    problem = reply_problem(result.text, validate)
    if problem is None:
        return result
    return ChatResult(result.text, result.prompt_tokens, result.completion_tokens, cached=result.cached,
                      error=problem, unusable=True)
