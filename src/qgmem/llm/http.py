"""OpenAI-compatible ``/chat/completions`` over HTTP (vLLM, SGLang, Ollama, OpenAI).

Requests run concurrently up to ``max_concurrency``; 429, 5xx, timeouts and dropped connections are
retried with exponential backoff (honouring ``Retry-After``); other 4xx and unreadable bodies fail the
item at once. The API key is read from the environment variable named in the config at construction
and lives only in the client's headers: it is never logged, cached or put in an error message.
"""

from __future__ import annotations

import os
import time
from concurrent.futures import ThreadPoolExecutor

import httpx

from qgmem.llm.base import ChatResult, Conversation, LLMBackend, LLMConfig

RETRY_STATUS = frozenset({408, 409, 425, 429, 500, 502, 503, 504})


class OpenAIChatBackend(LLMBackend):
    name = "openai"

    def __init__(self, config: LLMConfig, client: httpx.Client | None = None, sleep=time.sleep):
        super().__init__(config.model)
        self.config = config
        self.chunk_size = max(1, config.max_concurrency)
        headers = {"Content-Type": "application/json"}
        if config.api_key_env and os.environ.get(config.api_key_env):
            headers["Authorization"] = f"Bearer {os.environ[config.api_key_env]}"
        self._client = client or httpx.Client(
            base_url=config.base_url.rstrip("/"), headers=headers, timeout=httpx.Timeout(config.timeout_s),
            limits=httpx.Limits(max_connections=config.max_concurrency),
        )
        self._sleep = sleep

    def _chat(self, conversations: list[Conversation], *, max_new_tokens: int,
              temperature: float) -> list[ChatResult]:
        def one(messages: Conversation) -> ChatResult:
            return self._request(messages, max_new_tokens, temperature)

        if len(conversations) == 1 or self.config.max_concurrency <= 1:
            return [one(c) for c in conversations]
        with ThreadPoolExecutor(max_workers=min(self.config.max_concurrency, len(conversations))) as pool:
            return list(pool.map(one, conversations))

    def _backoff(self, attempt: int, retry_after: str | None) -> float:
        if retry_after:
            try:
                return min(float(retry_after), self.config.max_backoff_s)
            except ValueError:
                pass
        return min(self.config.backoff_s * (2 ** attempt), self.config.max_backoff_s)

    def _request(self, messages: Conversation, max_new_tokens: int, temperature: float) -> ChatResult:
        body = {"model": self.config.model, "messages": messages, "max_tokens": int(max_new_tokens),
                "temperature": float(temperature), **self.config.extra_body}
        error = "no attempt made"
        for attempt in range(self.config.max_retries + 1):
            retry_after = None
            try:
                response = self._client.post("/chat/completions", json=body)
            except httpx.TimeoutException:
                error = f"timeout after {self.config.timeout_s:g}s"
            except httpx.TransportError as e:
                error = f"connection error: {type(e).__name__}"
            else:
                if response.status_code == 200:
                    return self._parse(response)
                error = f"HTTP {response.status_code}: {response.text[:200]}"
                if response.status_code not in RETRY_STATUS:
                    return ChatResult("", 0, 0, error=error)
                retry_after = response.headers.get("retry-after")
            if attempt < self.config.max_retries:
                with self._lock:
                    self.usage.retries += 1
                self._sleep(self._backoff(attempt, retry_after))
        return ChatResult("", 0, 0, error=f"gave up after {self.config.max_retries + 1} attempts: {error}")

    @staticmethod
    def _parse(response: httpx.Response) -> ChatResult:
        try:
            data = response.json()
            text = data["choices"][0]["message"]["content"]
            if not isinstance(text, str):
                raise TypeError(f"content is {type(text).__name__}")
        except (ValueError, KeyError, IndexError, TypeError) as e:
            return ChatResult("", 0, 0, error=f"unreadable response body ({type(e).__name__}: {str(e)[:80]}): "
                                             f"{response.text[:200]!r}")
        usage = data.get("usage") or {}
        return ChatResult(text, int(usage.get("prompt_tokens") or 0), int(usage.get("completion_tokens") or 0))

    def close(self) -> None:
        self._client.close()
