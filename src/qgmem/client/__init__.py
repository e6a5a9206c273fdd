"""A Python client of ``qgmem serve``: :class:`MemoryClient` and :class:`AsyncMemoryClient` over httpx.

```python
from qgmem.client import MemoryClient
memory = MemoryClient("http://127.0.0.1:8000")          # the key from $QGMEM_API_KEY when it is set
memory.remember("ana", [{"speaker": "User", "text": "I moved to Lisbon."}], time="2024-05-01")
print(memory.search("ana", "Where do I live?").units[0].fact)
```

Results are the reply models of :mod:`qgmem.serving.routes.protocol` (pydantic; fields the server adds
later are kept). Each write gets its own ``Idempotency-Key``, sent again on its retries, so a retry of an
append the server stored but whose reply was lost returns the stored result instead of storing it twice.
A request is retried with exponential backoff on 503 and 504 (after ``Retry-After`` when the server
sends one) and on a connection error; a write without a key (forget, import, delete) is retried only
when it cannot have reached the server (a 503, a refused connection). A refusal is :class:`ServiceError`
with the server's status, type and message. Imports httpx and pydantic only: no torch.
"""

from __future__ import annotations

import asyncio
import os
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

import httpx

from qgmem.serving.routes import protocol as p

#: the environment variable the bearer key is read from when none is given
API_KEY_ENV = "QGMEM_API_KEY"
#: statuses a request is retried on (the server refused it before doing anything, or ran out of time)
RETRY_STATUSES = (503, 504)


class ServiceError(Exception):
    """A reply of 4xx or 5xx: ``status``, ``type`` and ``message`` of the server's error body."""

    def __init__(self, status: int, message: str, kind: str = ""):
        super().__init__(f"{status} {kind}: {message}" if kind else f"{status}: {message}")
        self.status, self.message, self.type = status, message, kind


@dataclass
class _Call:
    """One request: what to send, whether a retry is safe after it may have reached the server, and
    what the reply is."""

    method: str
    path: str
    reply: type | None
    json: Any = None
    params: dict[str, Any] | None = None
    keyed: bool = False  # a write made idempotent with an Idempotency-Key
    safe: bool = True  # a read: retried after any connection error
    headers: dict[str, str] = field(default_factory=dict)

    def __post_init__(self):
        if self.keyed:
            self.headers["Idempotency-Key"] = uuid.uuid4().hex  # one per write, the same on its retries

    def retry_after_error(self, error: httpx.TransportError) -> bool:
        return self.safe or self.keyed or isinstance(error, httpx.ConnectError)


class _Calls:
    """The endpoints as :class:`_Call` s, shared by the sync and async clients."""

    def __init__(self, base_url: str | None = None, *, api_key: str | None = None, api_key_env: str = API_KEY_ENV,
                 timeout: float = 60.0, retries: int = 3, backoff_s: float = 0.5, max_backoff_s: float = 30.0):
        """``base_url``: the server (default ``http://127.0.0.1:8000``); ``api_key``: the
        bearer key (default: the environment variable ``api_key_env`` when set); ``timeout``: seconds per
        attempt; ``retries``: attempts after the first; ``backoff_s``: the first wait, doubled each time
        up to ``max_backoff_s`` (a ``Retry-After`` is honoured up to the same bound)."""
        self.base_url = (base_url or "http://127.0.0.1:8000").rstrip("/")
        key = api_key if api_key is not None else os.environ.get(api_key_env)
        self.headers = {"Authorization": f"Bearer {key}"} if key else {}
        self.timeout, self.retries, self.backoff_s, self.max_backoff_s = timeout, retries, backoff_s, max_backoff_s

    @staticmethod
    def _user(user_id: str) -> str:
        from urllib.parse import quote

        return f"/v1/users/{quote(user_id, safe='')}"

    def _remember(self, user_id, turns, time=None) -> _Call:
        body = {"turns": list(turns), **({"time": time} if time is not None else {})}
        return _Call("POST", f"{self._user(user_id)}/sessions", p.Appended, body, keyed=True, safe=False)

    def _remember_many(self, user_id, sessions) -> _Call:
        return _Call("POST", f"{self._user(user_id)}/sessions/batch", p.BatchAppended, {"sessions": list(sessions)},
                     keyed=True, safe=False)

    def _search(self, user_id, question, **options) -> _Call:
        body = {"question": question, **{k: v for k, v in options.items() if v is not None}}
        return _Call("POST", f"{self._user(user_id)}/search", p.SearchResult, body)

    def _answer(self, user_id, question, **options) -> _Call:
        body = {"question": question, **{k: v for k, v in options.items() if v is not None}}
        return _Call("POST", f"{self._user(user_id)}/answer", p.AnswerResult, body)

    def _memories(self, user_id, offset=0, limit=100, **filters) -> _Call:
        params = {"offset": offset, "limit": limit, **{k: v for k, v in filters.items() if v is not None}}
        if isinstance(params.get("sessions"), (list, tuple)):
            params["sessions"] = ",".join(params["sessions"])
        return _Call("GET", f"{self._user(user_id)}/memories", p.Memories, params=params)

    def _forget(self, user_id, unit_id) -> _Call:
        from urllib.parse import quote

        return _Call("DELETE", f"{self._user(user_id)}/memories/{quote(unit_id, safe='')}", p.Forgotten, safe=False)

    def _export(self, user_id) -> _Call:
        return _Call("GET", f"{self._user(user_id)}/export", None)

    def _import(self, user_id, document) -> _Call:
        return _Call("POST", f"{self._user(user_id)}/import", p.Imported, document, safe=False)

    def _delete(self, user_id) -> _Call:
        return _Call("DELETE", self._user(user_id), p.Deleted, safe=False)

    def _wait(self, attempt: int, response: httpx.Response | None) -> float:
        """Seconds before the next attempt: the server's ``Retry-After`` when it gave one, else backoff."""
        wait = self.backoff_s * 2 ** attempt
        if response is not None:
            try:
                wait = float(response.headers.get("retry-after", wait))
            except ValueError:
                pass
        return min(max(wait, 0.0), self.max_backoff_s)

    def _request(self, call: _Call) -> dict[str, Any]:
        return {"method": call.method, "url": self.base_url + call.path, "json": call.json, "params": call.params,
                "headers": {**self.headers, **call.headers}}

    @staticmethod
    def _result(call: _Call, response: httpx.Response):
        if response.status_code >= 400:
            try:
                error = response.json()["error"]
                raise ServiceError(response.status_code, error["message"], error.get("type", ""))
            except (ValueError, KeyError, TypeError):
                raise ServiceError(response.status_code, response.text[:500]) from None
        data = response.json()
        return data if call.reply is None else call.reply.model_validate(data)


class MemoryClient(_Calls):
    """The memory service, synchronously (see the module docstring)."""

    def __init__(self, base_url: str | None = None, **options):
        super().__init__(base_url, **options)
        self.http = httpx.Client(timeout=self.timeout)

    def _send(self, call: _Call):
        for attempt in range(self.retries + 1):
            last = attempt == self.retries
            try:
                response = self.http.request(**self._request(call))
            except httpx.TransportError as error:
                if last or not call.retry_after_error(error):
                    raise
                time.sleep(self._wait(attempt, None))
                continue
            if response.status_code in RETRY_STATUSES and not last:
                time.sleep(self._wait(attempt, response))
                continue
            return self._result(call, response)

    def remember(self, user_id: str, turns: list[dict[str, Any]], time: str | None = None) -> p.Appended:
        """Append one session of turns ``{"speaker", "text", "time"?}``; returns once it is durable."""
        return self._send(self._remember(user_id, turns, time))

    def remember_many(self, user_id: str, sessions: list[dict[str, Any]]) -> p.BatchAppended:
        """Append several sessions ``{"turns", "time"?}`` at once (all or none)."""
        return self._send(self._remember_many(user_id, sessions))

    def search(self, user_id: str, question: str, *, time: str | None = None, limit: int | None = None,
               after: str | None = None, before: str | None = None, time_field: str | None = None,
               sessions: list[str] | None = None) -> p.SearchResult:
        return self._send(self._search(user_id, question, time=time, limit=limit, after=after, before=before,
                                       time_field=time_field, sessions=sessions))

    def answer(self, user_id: str, question: str, *, time: str | None = None, graph_mode: str | None = None,
               max_tokens: int | None = None) -> p.AnswerResult:
        return self._send(self._answer(user_id, question, time=time, graph_mode=graph_mode, max_tokens=max_tokens))

    def memories(self, user_id: str, *, offset: int = 0, limit: int = 100, **filters) -> p.Memories:
        return self._send(self._memories(user_id, offset, limit, **filters))

    def forget(self, user_id: str, unit_id: str) -> p.Forgotten:
        return self._send(self._forget(user_id, unit_id))

    def export(self, user_id: str) -> dict[str, Any]:
        """The user's history as one export document (what :meth:`import_user` takes)."""
        return self._send(self._export(user_id))

    def import_user(self, user_id: str, document: dict[str, Any]) -> p.Imported:
        return self._send(self._import(user_id, document))

    def delete(self, user_id: str) -> p.Deleted:
        return self._send(self._delete(user_id))

    def close(self) -> None:
        self.http.close()

    def __enter__(self) -> MemoryClient:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class AsyncMemoryClient(_Calls):
    """The memory service with ``async`` methods (the same as :class:`MemoryClient`'s)."""

    def __init__(self, base_url: str | None = None, **options):
        super().__init__(base_url, **options)
        self.http = httpx.AsyncClient(timeout=self.timeout)

    async def _send(self, call: _Call):
        for attempt in range(self.retries + 1):
            last = attempt == self.retries
            try:
                response = await self.http.request(**self._request(call))
            except httpx.TransportError as error:
                if last or not call.retry_after_error(error):
                    raise
                await asyncio.sleep(self._wait(attempt, None))
                continue
            if response.status_code in RETRY_STATUSES and not last:
                await asyncio.sleep(self._wait(attempt, response))
                continue
            return self._result(call, response)

    async def remember(self, user_id: str, turns: list[dict[str, Any]], time: str | None = None) -> p.Appended:
        return await self._send(self._remember(user_id, turns, time))

    async def remember_many(self, user_id: str, sessions: list[dict[str, Any]]) -> p.BatchAppended:
        return await self._send(self._remember_many(user_id, sessions))

    async def search(self, user_id: str, question: str, **options) -> p.SearchResult:
        return await self._send(self._search(user_id, question, **options))

    async def answer(self, user_id: str, question: str, **options) -> p.AnswerResult:
        return await self._send(self._answer(user_id, question, **options))

    async def memories(self, user_id: str, *, offset: int = 0, limit: int = 100, **filters) -> p.Memories:
        return await self._send(self._memories(user_id, offset, limit, **filters))

    async def forget(self, user_id: str, unit_id: str) -> p.Forgotten:
        return await self._send(self._forget(user_id, unit_id))

    async def export(self, user_id: str) -> dict[str, Any]:
        return await self._send(self._export(user_id))

    async def import_user(self, user_id: str, document: dict[str, Any]) -> p.Imported:
        return await self._send(self._import(user_id, document))

    async def delete(self, user_id: str) -> p.Deleted:
        return await self._send(self._delete(user_id))

    async def aclose(self) -> None:
        await self.http.aclose()

    async def __aenter__(self) -> AsyncMemoryClient:
        return self

    async def __aexit__(self, *exc) -> None:
        await self.aclose()


__all__ = ["API_KEY_ENV", "AsyncMemoryClient", "MemoryClient", "ServiceError"]
