"""``qgmem serve``'s HTTP app: per-user memories, answers, search, an OpenAI-compatible surface, metrics.

Endpoints (JSON in and out; errors are ``{"error": {"message", "type", "code"}}``):

- ``POST /v1/users/{user_id}/sessions`` ``{"turns": [{"speaker", "text", "time"?}, …], "time"?}``:
  append a session to the user's memory (a new user is created); the reply comes once it is durable.
  An ``Idempotency-Key`` header makes a retry return the first append's result instead of storing the
  session again.
- ``POST /v1/users/{user_id}/answer`` ``{"question", "time"?, "graph"?, "max_tokens"?}``: the answer,
  the memory it cites and every entry the LM read, the local graph, seconds per stage, tokens.
- ``POST /v1/users/{user_id}/search`` ``{"question", "time"?, "limit"?}``: the activated working memory
  for an agent that answers with its own LLM (ranked units with their times, trace states and scores,
  the local graph, and the graph as text the way ``--backbone api`` sends it); no LM call.
- ``GET /v1/users/{user_id}/memories?offset=&limit=``: the user's units, paged; ``DELETE
  /v1/users/{user_id}``: the user forgotten, every file of theirs removed.
- ``POST /v1/chat/completions``: OpenAI-compatible; ``user`` names the memory, the last user message is
  the question, ``stream: true`` sends the answer's tokens as server-sent events; ``GET /v1/models``
  and ``/v1/models/{id}``.
- ``GET /healthz``; ``GET /metrics``: Prometheus latency histograms per stage and per endpoint.

Bad input is a 4xx with a message and never reaches the models (:mod:`qgmem.serving.requests` holds
every body check); a full queue is a 503 with ``Retry-After``; an LM engine behind ``--lm-url`` that
fails is a 502 with its error, or a 504 when it ran out of time; a body not received within
``Limits.body_timeout_s`` a 408. Nothing of a request body is logged, the access log holds no query
string, and a 500 names a user's file relative to the store root.
"""

import asyncio
import hmac
import json
import logging
import os
import re
import time
import uuid
from contextlib import asynccontextmanager
from typing import Any

from qgmem.errors import IntegrityError, UserError
from qgmem.llm.prompt_embeds import EngineError
from qgmem.serving.batcher import Batcher, QueueFull
from qgmem.serving.requests import (ANSWER_FIELDS, SEARCH_FIELDS, ApiError, Limits, bad, chat_request,  # noqa: F401
                                    check_question, check_session, graph, integer, max_tokens, parse_body)
from qgmem.serving.users import BadUserId, IdempotencyConflict, UnknownUser, UserMemories, check_user_id

log = logging.getLogger("qgmem.serve")
STAGES = ("activation", "graph_features", "graph_encoding", "generation", "total")  # "queue": the batcher's

_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 1.5, 2.5, 5.0, 10.0, 30.0, 60.0)
#: what an Idempotency-Key may be (it is stored in the user's journal)
IDEMPOTENCY_KEY = re.compile(r"[\x21-\x7e]{1,200}")
#: units per page of GET /v1/users/{id}/memories at most
MAX_PAGE = 1000


class NoQueryString(logging.Filter):
    """Takes the query string out of uvicorn's access-log lines (a key or a token may ride in it)."""

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args
        if isinstance(args, tuple) and len(args) == 5 and isinstance(args[2], str) and "?" in args[2]:
            record.args = (*args[:2], args[2].split("?", 1)[0], *args[3:])
        return True


_NO_QUERY = NoQueryString()


class Metrics:
    """Prometheus metrics of one app (its own registry, so several apps can live in one process)."""

    def __init__(self):
        from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

        self.registry = CollectorRegistry()
        self.stage = Histogram("qgmem_stage_seconds", "Seconds per answering / memory stage", ["stage"],
                               buckets=_BUCKETS, registry=self.registry)
        self.request = Histogram("qgmem_request_seconds", "Seconds per request, by endpoint", ["endpoint"],
                                 buckets=_BUCKETS, registry=self.registry)
        self.requests = Counter("qgmem_requests", "Requests by endpoint and status", ["endpoint", "status"],
                                registry=self.registry)
        self.batch = Histogram("qgmem_batch_size", "Questions per LM batch", buckets=(1, 2, 4, 8, 16, 32),
                               registry=self.registry)
        self.queue = Gauge("qgmem_queue_depth", "Questions waiting for the LM", registry=self.registry)
        self.users = Gauge("qgmem_users_loaded", "User memories held in this process", registry=self.registry)
        self.units = Gauge("qgmem_units_loaded", "Memory units held in this process", registry=self.registry)

    def observe(self, stage: str, seconds: float) -> None:
        self.stage.labels(stage).observe(seconds)


class MemoryService:
    """The models (one pipeline), the users' memories and the batcher, shared by every request."""

    def __init__(self, pipeline: Any, store_root: str, *, max_batch: int = 8, max_wait_ms: float = 5.0,
                 max_queue: int = 64, snapshot_every: int = 1, limits: Limits | None = None,
                 max_loaded_users: int | None = None, max_loaded_units: int | None = None,
                 idle_unload_s: float | None = None):
        self.pipeline = pipeline
        pipeline.batch_size = max(pipeline.batch_size, max_batch)  # a batch of the batcher is one LM forward
        self.metrics = Metrics()
        self.users = UserMemories(store_root, pipeline, snapshot_every=snapshot_every,
                                  max_loaded_users=max_loaded_users, max_loaded_units=max_loaded_units,
                                  idle_unload_s=idle_unload_s)
        self.batcher = Batcher(pipeline, max_batch=max_batch, max_wait_ms=max_wait_ms, max_queue=max_queue,
                               observe=self.metrics.observe)
        self.limits = limits or Limits()
        builder = pipeline.builder()  # construction's models load now, not in the first user's append
        if getattr(builder, "parser", None) is not None:
            _ = builder.parser.nlp
        self.model_name = str((pipeline.encoder.export_config.get("lm") or {}).get("id") or "qgmem")
        self.started = int(time.time())

    @property
    def max_new_tokens(self) -> int:
        return int(getattr(self.pipeline.backbone, "max_new_tokens", None) or self.pipeline.max_new_tokens)

    def retrieve(self, user_id: str, question: str, when: str | None, cap: int | None = None):
        with self.users.hold(user_id) as user:  # an append to this user waits; other users' questions do not
            retrieved = self.pipeline.retrieve_one(user.memory, question, when)
        retrieved.max_new_tokens = cap
        if self.pipeline.prompts is not None:  # a question over the prompt budget fails here, not its batch
            self.pipeline.encode_prompts([retrieved])
        return retrieved

    def search(self, user_id: str, question: str, when: str | None, limit: int | None = None) -> dict[str, Any]:
        """The activated working memory of ``question`` (no graph features, no LM)."""
        from qgmem.activation.serialize import serialize_graph_triples
        from qgmem.prompting import memory_with_graph_text
        from qgmem.serving.records import graph_json, unit_json

        started = time.perf_counter()
        with self.users.hold(user_id) as user:
            memory = user.memory.activate(question, when)
            store = user.store
            units = len(store)
        seconds = time.perf_counter() - started
        ranked = list(zip(memory.units, memory.scores or [0.0] * len(memory.units)))[:limit]
        triples = serialize_graph_triples(memory.graph)
        return {"user": user_id, "question": question, "time": when, "store_units": units,
                "units": [{"label": f"M{i + 1}", **unit_json(u, store.trace_of(u)),
                           "score": round(float(score), 4)} for i, (u, score) in enumerate(ranked)],
                "graph": graph_json(memory.graph), "graph_text": triples,
                "memory_text": memory_with_graph_text(memory.text, triples),
                "seconds": {"activation": seconds}}

    def memories(self, user_id: str, offset: int, limit: int) -> dict[str, Any]:
        from qgmem.serving.records import unit_json

        with self.users.hold(user_id) as user:
            store = user.store
            page = [unit_json(u, store.trace_of(u)) for u in store.units[offset:offset + limit]]
            return {"user": user_id, "total": len(store), "offset": offset, "limit": limit, "units": page,
                    "sessions": user.sessions}

    def private(self, message: str) -> str:
        """``message`` with the store root's path taken out: a user's file named relative to it."""
        root = self.users.root
        for prefix in sorted({str(root.resolve()), str(root.absolute()), str(root)}, key=len, reverse=True):
            message = message.replace(prefix.rstrip(os.sep) + os.sep, "")
        return message

    def close(self) -> None:
        self.batcher.close()
        self.users.snapshot_all()


# ------------------------------------------------------------------------------------------- app
def create_app(service: MemoryService, api_key: str | None = None):
    """The FastAPI app over ``service``; ``api_key``: the bearer key every request but /healthz needs."""
    from fastapi import FastAPI, Request
    from fastapi.responses import JSONResponse, PlainTextResponse, StreamingResponse
    from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
    from starlette.concurrency import run_in_threadpool

    logging.getLogger("uvicorn.access").addFilter(_NO_QUERY)  # whoever runs the app: no query strings logged

    @asynccontextmanager
    async def lifespan(app):
        sweeper = None
        if service.users.idle_unload_s is not None:
            sweeper = asyncio.ensure_future(_sweep(service, min(30.0, max(0.05, service.users.idle_unload_s / 2))))
        yield
        if sweeper is not None:
            sweeper.cancel()
        await run_in_threadpool(service.close)

    app = FastAPI(title="qgmem", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)
    metrics, limits = service.metrics, service.limits
    key = api_key.encode() if api_key else None

    def error(status: int, message: str, headers: dict[str, str] | None = None) -> JSONResponse:
        kind = {400: "invalid_request_error", 401: "authentication_error", 404: "not_found_error",
                408: "timeout_error", 409: "conflict_error", 413: "request_too_large",
                502: "engine_error", 503: "overloaded_error", 504: "engine_timeout"}.get(status, "server_error")
        return JSONResponse({"error": {"message": message, "type": kind, "code": status}}, status_code=status,
                            headers=headers)

    def authorized(header: str) -> bool:
        scheme, _, token = header.strip().partition(" ")  # the scheme is case-insensitive (RFC 7235)
        return scheme.lower() == "bearer" and hmac.compare_digest(token.strip().encode(), key)

    @app.middleware("http")
    async def guard(request: Request, call_next):
        started = time.perf_counter()
        route = _endpoint(request.method, request.url.path)
        if key is not None and request.url.path != "/healthz" and not authorized(request.headers.get("authorization", "")):
            metrics.requests.labels(route, "401").inc()
            return error(401, "missing or wrong bearer key (header 'Authorization: Bearer <key>')")
        try:
            response = await call_next(request)
        except Exception:  # noqa: BLE001 - a bug: logged (no request content), the server lives on
            log.exception("internal error on %s %s", request.method, route)
            response = error(500, "internal error")
        metrics.requests.labels(route, str(response.status_code)).inc()
        metrics.request.labels(route).observe(time.perf_counter() - started)
        return response

    @app.exception_handler(ApiError)
    async def api_error(request: Request, exc: ApiError):
        return error(exc.status, exc.message, exc.headers)

    @app.exception_handler(UserError)
    async def user_error(request: Request, exc: UserError):
        message = service.private(str(exc))
        if isinstance(exc, EngineError):  # the LM engine behind --lm-url failed or ran out of time
            log.error("%s", message)
            return error(exc.status, message)
        if isinstance(exc, IntegrityError):  # the server's files, not the request: logged, the user not served
            log.error("user memory failed its check: %s", message)
            return error(500, f"this user's memory failed its integrity check: {message}")
        status = 404 if isinstance(exc, UnknownUser) else 409 if isinstance(exc, IdempotencyConflict) else 400
        return error(status, message)

    @app.exception_handler(404)
    async def not_found(request: Request, exc):
        return error(404, f"no endpoint {request.method} {request.url.path[:100]}")

    @app.exception_handler(405)
    async def not_allowed(request: Request, exc):
        return error(405, f"{request.method} is not allowed on {request.url.path[:100]}")

    async def read_json(request: Request) -> Any:
        length = request.headers.get("content-length")
        if length is not None and length.isdigit() and int(length) > limits.max_body_bytes:
            raise ApiError(413, f"the body is {length} bytes, over the limit of {limits.max_body_bytes}")
        body = bytearray()

        async def receive() -> None:
            async for chunk in request.stream():
                body.extend(chunk)
                if len(body) > limits.max_body_bytes:
                    raise ApiError(413, f"the body is over the limit of {limits.max_body_bytes} bytes")

        try:
            await asyncio.wait_for(receive(), timeout=limits.body_timeout_s)
        except asyncio.TimeoutError:
            raise ApiError(408, f"the body was not received within {limits.body_timeout_s:g} s ({len(body)} "
                                "bytes arrived)", {"Connection": "close"}) from None
        return parse_body(bytes(body))

    def check_queue() -> None:
        if service.batcher.depth() >= service.batcher.queue.maxsize:
            raise ApiError(503, "too many questions are waiting; retry shortly", {"Retry-After": "1"})

    def submit(retrieved, mode, on_text=None):
        try:
            return service.batcher.submit(retrieved, mode, on_text)
        except QueueFull:
            raise ApiError(503, "too many questions are waiting; retry shortly", {"Retry-After": "1"}) from None

    def observe(answer) -> None:
        for stage in STAGES:
            if stage in answer.seconds:
                metrics.observe(stage, answer.seconds[stage])
        metrics.queue.set(service.batcher.depth())

    def loaded() -> None:
        metrics.users.set(service.users.loaded())
        metrics.units.set(service.users.units())

    async def activate(user_id: str, question: str, when: str | None, cap: int | None):
        check_queue()
        return await run_in_threadpool(service.retrieve, user_id, question, when, cap)

    @app.post("/v1/users/{user_id}/sessions")
    async def append_session(user_id: str, request: Request):
        _check_id(user_id)
        idempotency = request.headers.get("idempotency-key")
        if idempotency is not None and not IDEMPOTENCY_KEY.fullmatch(idempotency):
            raise bad("header 'Idempotency-Key' must be 1 to 200 visible ASCII characters")
        turns, session_time = check_session(await read_json(request), limits)
        result = await run_in_threadpool(service.users.append, user_id, turns, session_time, idempotency)
        if not result.get("replayed"):
            for stage, seconds in result["seconds"].items():
                metrics.observe(f"append_{stage}", seconds)
        loaded()
        return result

    @app.post("/v1/users/{user_id}/answer")
    async def answer(user_id: str, request: Request):
        _check_id(user_id)
        body, question, when = check_question(await read_json(request), limits, ANSWER_FIELDS)
        mode, cap = graph(body), max_tokens(body, service.max_new_tokens)
        retrieved = await activate(user_id, question, when, cap)
        result, batch = await asyncio.wrap_future(submit(retrieved, mode))
        observe(result)
        return {"user": user_id, **result.to_dict(), "batch_size": batch}

    @app.post("/v1/users/{user_id}/search")
    async def search(user_id: str, request: Request):
        _check_id(user_id)
        body, question, when = check_question(await read_json(request), limits, SEARCH_FIELDS)
        limit = integer(body, "limit", 1, 1000)
        result = await run_in_threadpool(service.search, user_id, question, when, limit)
        metrics.observe("activation", result["seconds"]["activation"])
        return result

    @app.get("/v1/users/{user_id}/memories")
    async def memories(user_id: str, request: Request):
        _check_id(user_id)
        query = dict(request.query_params)
        for name in sorted(set(query) - {"offset", "limit"}):
            raise bad(f"unknown query parameter '{name}' (this endpoint takes offset, limit)")
        page = {}
        for name, low, high, default in (("offset", 0, None, 0), ("limit", 1, MAX_PAGE, 100)):
            raw = query.get(name)
            page[name] = default if raw is None else integer({name: int(raw) if raw.isdigit() else raw}, name, low, high)
        return await run_in_threadpool(service.memories, user_id, page["offset"], page["limit"])

    @app.delete("/v1/users/{user_id}")
    async def delete_user(user_id: str):
        _check_id(user_id)
        if not await run_in_threadpool(service.users.delete, user_id):
            raise UnknownUser(f"no memory for user {user_id!r}")
        loaded()
        return {"user": user_id, "deleted": True}

    def model_card(model_id: str) -> dict[str, Any]:
        return {"id": model_id, "object": "model", "created": service.started, "owned_by": "qgmem"}

    def model_ids() -> list[str]:
        return list(dict.fromkeys(["qgmem", service.model_name]))

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [model_card(m) for m in model_ids()]}

    @app.get("/v1/models/{model_id:path}")
    async def model(model_id: str):
        if model_id not in model_ids():
            raise ApiError(404, f"no model {model_id[:100]!r} (this server has {', '.join(model_ids())})")
        return model_card(model_id)

    @app.post("/v1/chat/completions")
    async def chat(request: Request):
        asked = chat_request(await read_json(request), limits, service.max_new_tokens)
        user_id = asked["user"]
        _check_id(user_id)
        model = asked["model"] or service.model_name
        retrieved = await activate(user_id, asked["question"], asked["time"], asked["max_tokens"])
        completion_id, created = f"chatcmpl-{uuid.uuid4().hex[:24]}", int(time.time())
        if not asked["stream"]:
            result, _ = await asyncio.wrap_future(submit(retrieved, asked["graph"]))
            observe(result)
            return {"id": completion_id, "object": "chat.completion", "created": created, "model": model,
                    "choices": [{"index": 0, "finish_reason": result.finish_reason,
                                 "message": {"role": "assistant", "content": result.answer}}],
                    "usage": _usage(result), "qgmem": _extras(result)}
        loop = asyncio.get_running_loop()
        pieces: asyncio.Queue[str] = asyncio.Queue()
        future = asyncio.wrap_future(submit(retrieved, asked["graph"],
                                            lambda piece: loop.call_soon_threadsafe(pieces.put_nowait, piece)))

        def chunk(delta: dict[str, Any], finish: str | None = None, **extra) -> str:
            data = {"id": completion_id, "object": "chat.completion.chunk", "created": created, "model": model,
                    "choices": [{"index": 0, "delta": delta, "finish_reason": finish}], **extra}
            return f"data: {json.dumps(data, ensure_ascii=False)}\n\n"

        async def events():
            sent = ""
            yield chunk({"role": "assistant", "content": ""})
            while True:
                getter = asyncio.ensure_future(pieces.get())
                done, _ = await asyncio.wait({getter, future}, return_when=asyncio.FIRST_COMPLETED)
                if getter in done:
                    sent += getter.result()
                    yield chunk({"content": getter.result()})
                    continue
                getter.cancel()
                break
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
            observe(result)
            if result.answer != sent and result.answer.startswith(sent):
                yield chunk({"content": result.answer[len(sent):]})
            yield chunk({}, result.finish_reason, usage=_usage(result), qgmem=_extras(result))
            yield "data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})

    @app.get("/healthz")
    async def healthz():
        return {"status": "ok", "users_loaded": service.users.loaded(), "queue": service.batcher.depth(),
                "batches": service.batcher.batches, "batched_questions": service.batcher.batched_questions}

    @app.get("/metrics")
    async def prometheus():
        metrics.queue.set(service.batcher.depth())
        return PlainTextResponse(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    return app


async def _sweep(service: MemoryService, every_s: float) -> None:
    """Unload idle users every ``every_s`` seconds (in a worker thread: a snapshot may be written)."""
    from starlette.concurrency import run_in_threadpool

    while True:
        await asyncio.sleep(every_s)
        try:
            if await run_in_threadpool(service.users.unload_idle):
                service.metrics.users.set(service.users.loaded())
                service.metrics.units.set(service.users.units())
        except Exception:  # noqa: BLE001 - the sweep goes on; the user stays loaded
            log.exception("unloading idle users failed")


def _check_id(user_id: str) -> None:
    try:
        check_user_id(user_id)
    except BadUserId as exc:
        raise ApiError(400, str(exc)) from None


def _endpoint(method: str, path: str) -> str:
    """The route template (user ids are not metric labels)."""
    if path.startswith("/v1/users/"):
        depth = path.count("/")
        if depth == 4:
            return "/v1/users/{user_id}/" + path.rsplit("/", 1)[-1]
        return "/v1/users/{user_id}" if depth == 3 and method == "DELETE" else "other"
    if path.startswith("/v1/models"):
        return "/v1/models" if path == "/v1/models" else "/v1/models/{id}"
    return path if path in ("/v1/chat/completions", "/healthz", "/metrics") else "other"


def _usage(answer) -> dict[str, int]:
    prompt = int(answer.tokens.get("prompt", 0)) + int(answer.tokens.get("graph", 0))
    completion = int(answer.tokens.get("generated", 0))
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def _extras(answer) -> dict[str, Any]:
    return {"cited": answer.cited, "memory": answer.memory, "graph": answer.graph, "seconds": answer.seconds,
            "graph_mode": answer.graph_mode}
