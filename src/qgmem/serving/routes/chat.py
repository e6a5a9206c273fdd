"""The OpenAI-compatible surface: ``POST /v1/chat/completions`` (``user`` names the memory, ``stream``
sends server-sent events) and the model list ``/v1/models``."""

import asyncio
import json
import logging
import time
import uuid
from typing import Any

from qgmem.errors import UserError
from qgmem.serving.requests import ApiError
from qgmem.serving.routes import protocol as p
from qgmem.serving.routes.common import activate, check_id, read_json

log = logging.getLogger("qgmem.serve")


def usage(answer) -> dict[str, int]:
    prompt = int(answer.tokens.get("prompt", 0)) + int(answer.tokens.get("graph", 0))
    completion = int(answer.tokens.get("generated", 0))
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def extras(answer) -> dict[str, Any]:
    """What qgmem adds to an OpenAI reply (under ``qgmem``)."""
    return {"cited": answer.cited, "memory": answer.memory, "graph": answer.graph, "seconds": answer.seconds,
            "graph_mode": answer.graph_mode}


def router(service: Any):
    from fastapi import APIRouter, Request
    from fastapi.responses import Response, StreamingResponse

    routes = APIRouter(prefix="/v1")

    def card(model_id: str) -> dict[str, Any]:
        return {"id": model_id, "object": "model", "created": service.started, "owned_by": "qgmem"}

    def model_ids() -> list[str]:
        return list(dict.fromkeys(["qgmem", service.model_name]))

    @routes.get("/models", **p.route(p.ModelList))
    async def models():
        return {"object": "list", "data": [card(m) for m in model_ids()]}

    # HEAD answers as GET does; a route of its own so that the schema has one operation per id
    routes.add_api_route("/models", models, methods=["HEAD"], include_in_schema=False)

    @routes.options("/models")
    async def models_options():
        return Response(status_code=204, headers={"Allow": "GET, HEAD, OPTIONS"})

    @routes.get("/models/{model_id:path}", **p.route(p.ModelCard))
    async def model(model_id: str):
        if model_id not in model_ids():
            raise ApiError(404, f"no model {model_id[:100]!r} (this server has {', '.join(model_ids())})")
        return card(model_id)

    @routes.post("/chat/completions", **p.route(p.ChatCompletion, p.ChatRequest))
    async def chat(request: Request):
        asked = p.validate(p.ChatRequest, await read_json(request, service.limits), service.limits)
        question = asked.question(service.limits)
        check_id(asked.user)
        retrieved = await activate(service, asked.user, question, asked.time, asked.token_cap(service.max_new_tokens))
        head = {"id": f"chatcmpl-{uuid.uuid4().hex[:24]}", "created": int(time.time()),
                "model": asked.model or service.model_name}
        if not asked.stream:
            result, _ = await asyncio.wrap_future(service.submit(retrieved, asked.graph_mode))
            service.observe(result)
            return {**head, "object": "chat.completion", "usage": usage(result), "qgmem": extras(result),
                    "choices": [{"index": 0, "finish_reason": result.finish_reason,
                                 "message": {"role": "assistant", "content": result.answer}}]}
        return StreamingResponse(stream(service, retrieved, asked.graph_mode, head), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})

    return routes


async def stream(service: Any, retrieved: Any, graph_mode: str | None, head: dict[str, Any]):
    """The answer's server-sent events: a role chunk, one chunk per decoded piece, the final chunk with
    ``finish_reason``, usage and qgmem's extras, then ``[DONE]`` (an error after the start: an event)."""
    loop = asyncio.get_running_loop()
    pieces: asyncio.Queue[str] = asyncio.Queue()
    future = asyncio.wrap_future(service.submit(retrieved, graph_mode,
                                                lambda piece: loop.call_soon_threadsafe(pieces.put_nowait, piece)))

    def chunk(delta: dict[str, Any], finish: str | None = None, **extra) -> str:
        data = {**head, "object": "chat.completion.chunk",
                "choices": [{"index": 0, "delta": delta, "finish_reason": finish}], **extra}
        return f"data: {json.dumps(data, ensure_ascii=False)}\n\n"

    sent = ""
    yield chunk({"role": "assistant", "content": ""})
    while True:
        getter = asyncio.ensure_future(pieces.get())
        done, _ = await asyncio.wait({getter, future}, return_when=asyncio.FIRST_COMPLETED)
        if getter not in done:
            getter.cancel()
            break
        sent += getter.result()
        yield chunk({"content": getter.result()})
    while not pieces.empty():
        piece = pieces.get_nowait()
        sent += piece
        yield chunk({"content": piece})
    try:
        result, _ = future.result()
    except Exception as exc:  # noqa: BLE001 - the stream has started: the error goes in an event
        message = service.private(str(exc)) if isinstance(exc, UserError) else "internal error"
        if not isinstance(exc, UserError):
            log.error("generation failed: %s", type(exc).__name__)
        yield f"data: {json.dumps({'error': {'message': message, 'type': 'server_error'}})}\n\n"
        yield "data: [DONE]\n\n"
        return
    service.observe(result)
    if result.answer != sent and result.answer.startswith(sent):
        yield chunk({"content": result.answer[len(sent):]})
    yield chunk({}, result.finish_reason, usage=usage(result), qgmem=extras(result))
    yield "data: [DONE]\n\n"
