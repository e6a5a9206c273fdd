"""OpenAI-compatible ``/chat/completions`` over HTTP (vLLM, SGLang, Ollama, OpenAI).

Requests run concurrently up to ``max_concurrency``: one pool of that many request threads serves every
caller, so threads that share the backend (cases replayed side by side) never hold more requests in
flight together than that; 429, 5xx, timeouts, dropped connections and empty
replies (HTTP 200 with no content) are retried with exponential backoff (honouring ``Retry-After``);
other 4xx and unreadable bodies fail the item at once. ``timeout_s`` bounds each read; ``deadline_s``
bounds the whole request, retries and backoff included: the body is read as a stream and abandoned
when the deadline passes, so a server that sends one byte at a time cannot hold a call open. The API key is read from the environment variable named in the config at construction
and lives only in the client's headers: it is never logged or cached, and every error message is passed
through :func:`redact` first, so a server that echoes the ``Authorization`` header in an error body (or
any ``Bearer …`` token) cannot put the key in a summary, a log or the console.
"""

from __future__ import annotations

import json
import os
import re
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import httpx

from qgmem.llm.base import ChatResult, Conversation, LLMBackend, LLMConfig, reply_problem

RETRY_STATUS = frozenset({408, 409, 425, 429, 500, 502, 503, 504})
#: a chat reply is a few kilobytes; a body past this is not one (and must not fill memory)
MAX_BODY_BYTES = 64 * 1024 * 1024


_BEARER = re.compile(r"(Bearer\s+)[^\s\"',;}\]]+", re.IGNORECASE)
REDACTED = "[redacted]"


def redact(text: str, secrets: tuple[str, ...] = ()) -> str:
    """``text`` with each of ``secrets`` and every ``Bearer <token>`` replaced by ``[redacted]``."""
    text = _BEARER.sub(lambda m: m.group(1) + REDACTED, text)
    for secret in secrets:
        if secret:
            text = text.replace(secret, REDACTED)
    return text


def _excerpt(raw: bytes, secrets: tuple[str, ...], limit: int = 200) -> str:
    """The first ``limit`` characters of a body for an error message, redacted *before* it is cut (so no
    part of a key survives at the cut)."""
    return redact(raw[: 64 * 1024].decode("utf-8", "replace"), secrets)[:limit]


class DeadlineExceeded(Exception):
    """The overall deadline of a request passed while it was still being sent or read."""


def _count(value) -> int:
    try:
        return max(0, int(value or 0))
    except (TypeError, ValueError):
        return 0


class OpenAIChatBackend(LLMBackend):
    name = "openai"
    concurrent_callers = True

    def __init__(self, config: LLMConfig, client: httpx.Client | None = None, sleep=time.sleep):
        super().__init__(config.model)
        self.config = config
        self.chunk_size = max(1, config.max_concurrency)
        headers = {"Content-Type": "application/json"}
        self._secrets: tuple[str, ...] = ()
        if config.api_key_env and os.environ.get(config.api_key_env):
            headers["Authorization"] = f"Bearer {os.environ[config.api_key_env]}"
            self._secrets = (os.environ[config.api_key_env],)
        self._client = client or httpx.Client(
            base_url=config.base_url.rstrip("/"), headers=headers, timeout=httpx.Timeout(config.timeout_s),
            limits=httpx.Limits(max_connections=config.max_concurrency),
        )
        self._sleep = sleep
        self._pool: ThreadPoolExecutor | None = None
        self._pool_lock = threading.Lock()

    def _requests(self) -> ThreadPoolExecutor:
        """The request threads every caller shares: at most ``max_concurrency`` requests in flight in all."""
        with self._pool_lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(max_workers=self.chunk_size, thread_name_prefix="qgmem-http")
            return self._pool

    def _chat(self, conversations: list[Conversation], *, max_new_tokens: int,
              temperature: float) -> list[ChatResult]:
        pool = self._requests()
        futures = [pool.submit(self._request, c, max_new_tokens, temperature) for c in conversations]
        return [self._redacted(f.result()) for f in futures]

    def _redacted(self, result: ChatResult) -> ChatResult:
        """The result with the key (and any bearer token) taken out of its error message."""
        if result.error is not None:
            result.error = redact(result.error, self._secrets)
        return result

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
        return self.send("/chat/completions", body, self._parse)

    def send(self, path: str, body: dict, parse: Callable[[bytes, tuple[str, ...]], ChatResult], *,
             problem: Callable[[str], str | None] | None = reply_problem,
             sink: Callable[[], Callable[[bytes], None]] | None = None,
             may_retry: Callable[[], bool] = lambda: True) -> ChatResult:
        """POST ``body`` to ``path`` with the retries and the deadline of the module docstring.

        ``parse(raw, secrets)`` reads an HTTP 200 body; ``problem(text)`` names why a parsed reply is
        unusable (retried like a 5xx; ``None``: any text is a reply). ``sink()`` makes, for each attempt, a
        function given each chunk of an HTTP 200 body as it arrives (a streamed reply); ``may_retry()`` says whether a failed attempt
        may be sent again (not once a stream has handed part of its reply on).
        """
        deadline = time.monotonic() + self.config.deadline_s
        error = "no attempt made"
        replied = False  # the last attempt got an HTTP 200 (an empty or unusable reply is the model's answer)
        timed_out = False  # the last attempt ran out of time (a read timeout)
        for attempt in range(self.config.max_retries + 1):
            retry_after = None
            try:
                status, raw, retry_after = self._post(path, body, deadline, sink() if sink else None)
            except DeadlineExceeded as e:
                return ChatResult("", 0, 0, error=f"deadline of {self.config.deadline_s:g}s exceeded "
                                                  f"(attempt {attempt + 1}: {e})", unavailable=True, timed_out=True)
            except httpx.TimeoutException:
                error, replied, timed_out = f"timeout after {self.config.timeout_s:g}s", False, True
            except httpx.TransportError as e:
                error, replied, timed_out = f"connection error: {type(e).__name__}", False, False
            else:
                replied, timed_out = status == 200, False
                if status == 200:
                    result = parse(raw, self._secrets)
                    found = problem(result.text) if result.error is None and problem is not None else None
                    if found is not None:
                        error = f"{found}: HTTP 200 with no usable content"
                    else:
                        return result
                else:
                    error = f"HTTP {status}: {_excerpt(raw, self._secrets)}"
                    if status not in RETRY_STATUS:
                        return ChatResult("", 0, 0, error=error)
            if attempt < self.config.max_retries and may_retry():
                wait = self._backoff(attempt, retry_after)
                if time.monotonic() + wait >= deadline:
                    return ChatResult("", 0, 0, error=f"deadline of {self.config.deadline_s:g}s exceeded after "
                                                      f"{attempt + 1} attempts: {error}", unavailable=not replied,
                                      timed_out=True)
                with self._lock:
                    self.usage.retries += 1
                self._sleep(wait)
            elif not may_retry():
                return ChatResult("", 0, 0, error=f"failed after part of a streamed reply: {error}",
                                  unavailable=not replied, timed_out=timed_out)
        return ChatResult("", 0, 0, error=f"gave up after {self.config.max_retries + 1} attempts: {error}",
                          unavailable=not replied, timed_out=timed_out)

    def _post(self, path: str, body: dict, deadline: float,
              on_bytes: Callable[[bytes], None] | None = None) -> tuple[int, bytes, str | None]:
        """POST and read the body in chunks, giving up once ``deadline`` (monotonic seconds) passes."""
        if time.monotonic() >= deadline:
            raise DeadlineExceeded("no time left before sending")
        with self._client.stream("POST", path, json=body) as response:
            chunks, size = [], 0
            for chunk in response.iter_bytes():
                chunks.append(chunk)
                size += len(chunk)
                if on_bytes is not None and response.status_code == 200:
                    on_bytes(chunk)
                if time.monotonic() >= deadline:
                    raise DeadlineExceeded(f"{size} bytes of the reply read")
                if size > MAX_BODY_BYTES:
                    raise httpx.TransportError(f"reply larger than {MAX_BODY_BYTES} bytes")
            return response.status_code, b"".join(chunks), response.headers.get("retry-after")

    @staticmethod
    def _parse(raw: bytes, secrets: tuple[str, ...] = ()) -> ChatResult:
        try:
            data = json.loads(raw)
            text = data["choices"][0]["message"]["content"]
            if not isinstance(text, str):
                raise TypeError(f"content is {type(text).__name__}")
        except (ValueError, KeyError, IndexError, TypeError) as e:
            return ChatResult("", 0, 0, error=f"unreadable response body ({type(e).__name__}: "
                                             f"{redact(str(e), secrets)[:80]}): {_excerpt(raw, secrets)!r}")
        usage = data.get("usage") if isinstance(data, dict) else None
        usage = usage if isinstance(usage, dict) else {}
        return ChatResult(text, _count(usage.get("prompt_tokens")), _count(usage.get("completion_tokens")))

    def close(self) -> None:
        with self._pool_lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)
        self._client.close()
