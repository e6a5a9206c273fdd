"""What the routers share: the error body, the bounded and timed body read, the user-id check, and a
question's way through activation (in a worker thread) to the batcher."""

from __future__ import annotations

import asyncio
from typing import Any

from qgmem.serving.requests import PARSE_INLINE_BYTES, ApiError, Limits, check_shape, parse_body
from qgmem.serving.users import BadUserId, check_user_id

#: the OpenAI error ``type`` of each status
ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 404: "not_found_error",
               408: "timeout_error", 409: "conflict_error", 413: "request_too_large",
               502: "engine_error", 503: "overloaded_error", 504: "engine_timeout"}


def error(status: int, message: str, headers: dict[str, str] | None = None):
    """``{"error": {"message", "type", "code"}}`` with ``status``."""
    from fastapi.responses import JSONResponse

    return JSONResponse({"error": {"message": message, "type": ERROR_TYPES.get(status, "server_error"),
                                   "code": status}}, status_code=status, headers=headers)


def check_id(user_id: str) -> str:
    try:
        return check_user_id(user_id)
    except BadUserId as exc:
        raise ApiError(400, str(exc)) from None


async def read_body(request: Any, limits: Limits, max_bytes: int | None = None) -> bytes:
    """The body, at most ``max_bytes`` (default: ``limits.max_body_bytes``; past it: 413), received
    within ``limits.body_timeout_s`` (else 408 and the connection closed)."""
    limit = max_bytes or limits.max_body_bytes
    length = request.headers.get("content-length")
    if length is not None and length.isdigit() and int(length) > limit:
        raise ApiError(413, f"the body is {length} bytes, over the limit of {limit}")
    body = bytearray()

    async def receive() -> None:
        async for chunk in request.stream():
            body.extend(chunk)
            if len(body) > limit:
                raise ApiError(413, f"the body is over the limit of {limit} bytes")

    try:
        await asyncio.wait_for(receive(), timeout=limits.body_timeout_s)
    except asyncio.TimeoutError:
        raise ApiError(408, f"the body was not received within {limits.body_timeout_s:g} s ({len(body)} "
                            "bytes arrived)", {"Connection": "close"}) from None
    return bytes(body)


async def read_json(request: Any, limits: Limits, max_bytes: int | None = None) -> Any:
    """The body's JSON: its shape bounded first (:func:`~qgmem.serving.requests.check_shape`), a large one
    parsed in a worker thread so that every other request is served meanwhile."""
    raw = await read_body(request, limits, max_bytes)
    check_shape(raw, limits)
    return parse_body(raw) if len(raw) <= PARSE_INLINE_BYTES else await in_thread(parse_body, raw)


async def in_thread(function, *args):
    """``function(*args)`` in a worker thread (disk, construction and activation never block the loop)."""
    from starlette.concurrency import run_in_threadpool

    return await run_in_threadpool(function, *args)


async def activate(service: Any, user_id: str, question: str, when: str | None, cap: int | None):
    """The question's :class:`~qgmem.serving.records.Retrieved` (a full queue is refused first: 503)."""
    service.check_queue()
    return await in_thread(service.retrieve, user_id, question, when, cap)
