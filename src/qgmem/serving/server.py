"""``qgmem serve``'s HTTP app: per-user memories, answers, an OpenAI-compatible endpoint, metrics.

Endpoints (JSON in and out; errors are ``{"error": {"message", "type", "code"}}``):

- ``POST /v1/users/{user_id}/sessions`` ``{"turns": [{"speaker", "text", "time"?}, …], "time"?}``:
  append a session to the user's memory (a new user is created); the reply comes once it is durable.
- ``POST /v1/users/{user_id}/answer`` ``{"question", "time"?, "graph"?}``: the answer, the memory it
  cites and every entry the LM read, the local graph, seconds per stage, tokens.
- ``POST /v1/chat/completions``: OpenAI-compatible; ``user`` names the memory, the last user message is
  the question, ``stream: true`` sends the answer's tokens as server-sent events.
- ``GET /healthz``; ``GET /metrics``: Prometheus latency histograms per stage and per endpoint.

Bad input is a 4xx with a message and never reaches the models: malformed JSON or a bad field 400, an
unknown user 404, an over-long body, turn or question 413, a user id outside ``[A-Za-z0-9_.-]{1,128}``
400; a full queue 503 with ``Retry-After``. Nothing of a request body is logged.
"""


import asyncio
import hmac
import json
import logging
import time
import uuid
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

from qgmem.errors import IntegrityError, UserError
from qgmem.model.graph_modes import GRAPH_MODES
from qgmem.serving.batcher import Batcher, QueueFull
from qgmem.serving.users import BadUserId, UnknownUser, UserMemories

log = logging.getLogger("qgmem.serve")
STAGES = ("activation", "graph_features", "graph_encoding", "generation", "total")  # "queue": the batcher's

_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 1.5, 2.5, 5.0, 10.0, 30.0, 60.0)


@dataclass
class Limits:
    """What one request may hold (past these: 413)."""

    max_body_bytes: int = 1_000_000
    max_turns: int = 500
    max_turn_chars: int = 8_000
    max_speaker_chars: int = 128
    max_question_chars: int = 2_000


class ApiError(Exception):
    def __init__(self, status: int, message: str, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status, self.message, self.headers = status, message, headers or {}


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
                 max_queue: int = 64, snapshot_every: int = 1, limits: Limits | None = None):
        self.pipeline = pipeline
        pipeline.batch_size = max(pipeline.batch_size, max_batch)  # a batch of the batcher is one LM forward
        self.metrics = Metrics()
        self.users = UserMemories(store_root, pipeline, snapshot_every=snapshot_every)
        self.batcher = Batcher(pipeline, max_batch=max_batch, max_wait_ms=max_wait_ms, max_queue=max_queue,
                               observe=self.metrics.observe)
        self.limits = limits or Limits()
        builder = pipeline.builder()  # construction's models load now, not in the first user's append
        if getattr(builder, "parser", None) is not None:
            _ = builder.parser.nlp
        self.model_name = str((pipeline.encoder.export_config.get("lm") or {}).get("id") or "qgmem")

    def retrieve(self, user_id: str, question: str, when: str | None):
        user = self.users.get(user_id)
        with user.lock:  # an append to this user waits; other users' questions do not
            activator = self.users.activator(user)
            retrieved = self.pipeline.retrieve_one(activator, len(user.store), question, when)
        if self.pipeline.prompts is not None:  # a question over the prompt budget fails here, not its batch
            self.pipeline.encode_prompts([retrieved])
        return retrieved

    def close(self) -> None:
        self.batcher.close()
        self.users.snapshot_all()


# ------------------------------------------------------------------------------------ validation
def _field_error(message: str) -> ApiError:
    return ApiError(400, message)


def _string(body: dict, key: str, where: str, required: bool = True, limit: int | None = None) -> str | None:
    value = body.get(key)
    if value is None and not required:
        return None
    if not isinstance(value, str) or (required and not value.strip()):
        raise _field_error(f"{where}field '{key}' must be a non-empty string")
    if limit is not None and len(value) > limit:
        raise ApiError(413, f"{where}field '{key}' is {len(value)} characters, over the limit of {limit}")
    return value


def check_session(body: Any, limits: Limits) -> tuple[list[dict[str, Any]], str | None]:
    if not isinstance(body, dict):
        raise _field_error("the body must be a JSON object with field 'turns'")
    turns = body.get("turns")
    if not isinstance(turns, list) or not turns:
        raise _field_error("field 'turns' must be a non-empty list of {\"speaker\", \"text\", \"time\"?}")
    if len(turns) > limits.max_turns:
        raise ApiError(413, f"field 'turns' holds {len(turns)} turns, over the limit of {limits.max_turns}")
    session_time = _string(body, "time", "", required=False, limit=64)
    out = []
    for i, turn in enumerate(turns):
        where = f"turns[{i}]: "
        if not isinstance(turn, dict):
            raise _field_error(f"{where}a turn must be an object with 'speaker' and 'text'")
        clean = {"speaker": _string(turn, "speaker", where, limit=limits.max_speaker_chars),
                 "text": _string(turn, "text", where, limit=limits.max_turn_chars)}
        when = _string(turn, "time", where, required=False, limit=64)
        if when is not None:
            clean["time"] = when
        out.append(clean)
    return out, session_time


def _graph(body: dict) -> str:
    graph = body.get("graph", "token")
    if graph not in GRAPH_MODES:
        raise _field_error(f"field 'graph' must be one of {', '.join(GRAPH_MODES)}, got {str(graph)[:20]!r}")
    return graph


def chat_question(body: Any, limits: Limits) -> tuple[str, str, str | None]:
    """``(user, question, time)`` of an OpenAI chat-completions body."""
    if not isinstance(body, dict):
        raise _field_error("the body must be a JSON object")
    user = body.get("user")
    if not isinstance(user, str) or not user:
        raise _field_error("field 'user' must name the memory to answer from (a user id)")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise _field_error("field 'messages' must be a non-empty list")
    question = None
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise _field_error(f"messages[{i}] must be an object with 'role' and 'content'")
        if message["role"] == "user":
            question = _content_text(message.get("content"), i)
    if question is None or not question.strip():
        raise _field_error("field 'messages' holds no user message with text: the last one is the question")
    if len(question) > limits.max_question_chars:
        raise ApiError(413, f"the question is {len(question)} characters, over the limit of "
                            f"{limits.max_question_chars}")
    return user, question, _string(body, "time", "", required=False, limit=64)


def _content_text(content: Any, i: int) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = [p.get("text") for p in content if isinstance(p, dict) and p.get("type") == "text"]
        if all(isinstance(p, str) for p in parts):
            return "\n".join(parts)
    raise _field_error(f"messages[{i}].content must be a string or a list of text parts")


# ------------------------------------------------------------------------------------------- app
def create_app(service: MemoryService, api_key: str | None = None):
    """The FastAPI app over ``service``; ``api_key``: the bearer key every request but /healthz needs."""
    from fastapi import FastAPI, Request
    from fastapi.responses import JSONResponse, PlainTextResponse, StreamingResponse
    from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
    from starlette.concurrency import run_in_threadpool

    @asynccontextmanager
    async def lifespan(app):
        yield
        await run_in_threadpool(service.close)

    app = FastAPI(title="qgmem", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)
    metrics, limits = service.metrics, service.limits
    expected = f"Bearer {api_key}".encode() if api_key else None

    def error(status: int, message: str, headers: dict[str, str] | None = None) -> JSONResponse:
        kind = {400: "invalid_request_error", 401: "authentication_error", 404: "not_found_error",
                413: "request_too_large", 503: "overloaded_error"}.get(status, "server_error")
        return JSONResponse({"error": {"message": message, "type": kind, "code": status}}, status_code=status,
                            headers=headers)

    @app.middleware("http")
    async def guard(request: Request, call_next):
        started = time.perf_counter()
        route = _endpoint(request.url.path)
        if expected is not None and request.url.path != "/healthz":
            given = request.headers.get("authorization", "").encode()
            if not hmac.compare_digest(given, expected):
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
        if isinstance(exc, IntegrityError):  # the server's files, not the request: logged, the user not served
            log.error("user memory failed its check: %s", exc)
            return error(500, f"this user's memory failed its integrity check: {exc}")
        status = 404 if isinstance(exc, UnknownUser) else 400
        return error(status, str(exc))

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
        async for chunk in request.stream():
            body += chunk
            if len(body) > limits.max_body_bytes:
                raise ApiError(413, f"the body is over the limit of {limits.max_body_bytes} bytes")
        try:
            return json.loads(bytes(body).decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            where = f" (line {exc.lineno}, column {exc.colno})" if isinstance(exc, json.JSONDecodeError) else ""
            raise ApiError(400, f"malformed JSON body: {getattr(exc, 'msg', 'not UTF-8')}{where}") from None

    def check_queue() -> None:
        if service.batcher.depth() >= service.batcher.queue.maxsize:
            raise ApiError(503, "too many questions are waiting; retry shortly", {"Retry-After": "1"})

    def submit(retrieved, graph, on_text=None):
        try:
            return service.batcher.submit(retrieved, graph, on_text)
        except QueueFull:
            raise ApiError(503, "too many questions are waiting; retry shortly", {"Retry-After": "1"}) from None

    def observe(answer) -> None:
        for stage in STAGES:
            if stage in answer.seconds:
                metrics.observe(stage, answer.seconds[stage])
        metrics.queue.set(service.batcher.depth())

    async def activate(user_id: str, question: str, when: str | None):
        check_queue()
        return await run_in_threadpool(service.retrieve, user_id, question, when)

    @app.post("/v1/users/{user_id}/sessions")
    async def append_session(user_id: str, request: Request):
        _check_id(user_id)
        turns, session_time = check_session(await read_json(request), limits)
        result = await run_in_threadpool(service.users.append, user_id, turns, session_time)
        for stage, seconds in result["seconds"].items():
            metrics.observe(f"append_{stage}", seconds)
        metrics.users.set(service.users.loaded())
        metrics.units.set(service.users.units())
        return result

    @app.post("/v1/users/{user_id}/answer")
    async def answer(user_id: str, request: Request):
        _check_id(user_id)
        body = await read_json(request)
        if not isinstance(body, dict):
            raise _field_error("the body must be a JSON object with field 'question'")
        question = _string(body, "question", "", limit=limits.max_question_chars)
        when, graph = _string(body, "time", "", required=False, limit=64), _graph(body)
        retrieved = await activate(user_id, question, when)
        result, batch = await asyncio.wrap_future(submit(retrieved, graph))
        observe(result)
        return {"user": user_id, **result.to_dict(), "batch_size": batch}

    @app.post("/v1/chat/completions")
    async def chat(request: Request):
        body = await read_json(request)
        user_id, question, when = chat_question(body, limits)
        _check_id(user_id)
        graph = _graph(body)
        model = body.get("model") if isinstance(body.get("model"), str) else service.model_name
        retrieved = await activate(user_id, question, when)
        completion_id, created = f"chatcmpl-{uuid.uuid4().hex[:24]}", int(time.time())
        if not body.get("stream"):
            result, _ = await asyncio.wrap_future(submit(retrieved, graph))
            observe(result)
            return {"id": completion_id, "object": "chat.completion", "created": created, "model": model,
                    "choices": [{"index": 0, "finish_reason": "stop",
                                 "message": {"role": "assistant", "content": result.answer}}],
                    "usage": _usage(result), "qgmem": _extras(result)}
        loop = asyncio.get_running_loop()
        pieces: asyncio.Queue[str] = asyncio.Queue()
        future = asyncio.wrap_future(submit(retrieved, graph,
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
                message = str(exc) if isinstance(exc, UserError) else "internal error"
                if not isinstance(exc, UserError):
                    log.error("generation failed: %s", type(exc).__name__)
                yield f"data: {json.dumps({'error': {'message': message, 'type': 'server_error'}})}\n\n"
                yield "data: [DONE]\n\n"
                return
            observe(result)
            if result.answer != sent and result.answer.startswith(sent):
                yield chunk({"content": result.answer[len(sent):]})
            yield chunk({}, "stop", usage=_usage(result), qgmem=_extras(result))
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


def _check_id(user_id: str) -> None:
    from qgmem.serving.users import check_user_id

    try:
        check_user_id(user_id)
    except BadUserId as exc:
        raise ApiError(400, str(exc)) from None


def _endpoint(path: str) -> str:
    """The route template (user ids are not metric labels)."""
    if path.startswith("/v1/users/"):
        return "/v1/users/{user_id}/" + path.rsplit("/", 1)[-1] if path.count("/") == 4 else "other"
    return path if path in ("/v1/chat/completions", "/healthz", "/metrics") else "other"


def _usage(answer) -> dict[str, int]:
    prompt = int(answer.tokens.get("prompt", 0)) + int(answer.tokens.get("graph", 0))
    completion = int(answer.tokens.get("generated", 0))
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def _extras(answer) -> dict[str, Any]:
    return {"cited": answer.cited, "memory": answer.memory, "graph": answer.graph, "seconds": answer.seconds,
            "graph_mode": answer.graph_mode}
