"""``qgmem serve``'s HTTP app: per-user memories, answers, search, an OpenAI-compatible surface, metrics.

:class:`MemoryService` holds the models, the users' memories and the batcher; :func:`create_app` puts the
routers of :mod:`qgmem.serving.routes` (users, chat, operations) over it, with the key check, the
metrics per route and the error shape. Endpoints (JSON in and out; errors are ``{"error": {"message", "type", "code"}}``):

- ``POST /v1/users/{user_id}/sessions`` ``{"turns": [{"speaker", "text", "time"?}, …], "time"?}``:
  append a session to the user's memory (a new user is created); the reply comes once it is durable.
  An ``Idempotency-Key`` header makes a retry return the first append's result instead of storing the
  session again.
- ``POST /v1/users/{user_id}/answer`` ``{"question", "time"?, "graph_mode"?, "max_tokens"?}``: the answer,
  the memory it cites and every entry the LM read, the local graph, seconds per stage, tokens.
- ``POST /v1/users/{user_id}/search`` ``{"question", "time"?, "limit"?}``: the activated working memory
  for an agent that answers with its own LLM (ranked units with their times, trace states and scores,
  the local graph, and the graph as text the way ``--backbone api`` sends it); no LM call.
- ``POST /v1/users/{user_id}/sessions/batch`` ``{"sessions": [{"turns", "time"?}, …]}``: several sessions,
  one change each, acknowledged once all are committed (idempotent as a whole with the key).
- ``GET /v1/users/{user_id}/memories?offset=&limit=``: the user's units, paged; ``DELETE
  /v1/users/{user_id}``: the user forgotten, every row of theirs removed; ``DELETE
  /v1/users/{user_id}/memories/{unit_id}``: one unit forgotten (stored as a change). ``search`` and ``memories``
  take filters (``after``, ``before``, ``time_field``, ``sessions``: :mod:`qgmem.serving.filters`).
- ``GET /v1/users/{user_id}/export`` (streamed) and ``POST /v1/users/{user_id}/import``: a user's
  history as one JSON document, and a new user with the same memory from it.
- ``POST /v1/chat/completions``: OpenAI-compatible; ``user`` names the memory, the last user message is
  the question, ``stream: true`` sends the answer's tokens as server-sent events; ``GET /v1/models``
  and ``/v1/models/{id}``.
- ``GET /healthz``; ``GET /metrics``: Prometheus latency histograms per stage and per endpoint.

Bad input is a 4xx with a message and never reaches the models (:mod:`qgmem.serving.requests` and the
models of :mod:`qgmem.serving.routes.protocol`; ``GET /openapi.json`` is their schema); a full queue is a
503 with ``Retry-After``; an LM engine behind ``--lm-url`` that fails is a 502 with its error, or a 504
when it ran out of time; a body not received within ``Limits.body_timeout_s`` a 408. The same memory is
served as MCP tools at ``/mcp`` (:mod:`qgmem.serving.mcp`). Nothing of a request body is logged, the
access log holds no query string, and a 500 names no path of this machine. A store that cannot be reached
(a database restart) is a 503 with ``Retry-After``, a full disk a 507; neither stored anything of the
request.
"""

import asyncio
import gc
import hmac
import logging
import os
import time
from contextlib import asynccontextmanager, contextmanager
from typing import Any

from qgmem.errors import IntegrityError, UserError
from qgmem.llm.prompt_embeds import EngineError
from qgmem.serving.batcher import Batcher, QueueFull
from qgmem.serving.filters import Filters
from qgmem.serving.requests import ApiError, Limits
from qgmem.serving.storage.base import StoreFull, StoreUnavailable
from qgmem.serving.users import IdempotencyConflict, UnknownUnit, UnknownUser, UserExists, UserMemories, session_count

log = logging.getLogger("qgmem.serve")
STAGES = ("activation", "graph_features", "graph_encoding", "generation", "total")  # "queue": the batcher's

_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 1.5, 2.5, 5.0, 10.0, 30.0, 60.0)


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
        self.refused = Counter("qgmem_unauthorized_requests", "Requests refused for a missing or wrong key",
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

    def __init__(self, pipeline: Any, store: Any, *, max_batch: int = 8, max_wait_ms: float = 5.0,
                 max_queue: int = 64, snapshot_every: int = 1, limits: Limits | None = None,
                 max_loaded_users: int | None = None, max_loaded_units: int | None = None,
                 idle_unload_s: float | None = None):
        self.pipeline = pipeline
        pipeline.batch_size = max(pipeline.batch_size, max_batch)  # a batch of the batcher is one LM forward
        self.metrics = Metrics()
        self.users = UserMemories(store, pipeline, snapshot_every=snapshot_every,
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
        self._imports = 0  # imports in progress (read, parsed, stored), counted on the event loop

    def imports_running(self) -> int:
        return self._imports

    @contextmanager
    def importing(self):
        """One of ``limits.max_concurrent_imports`` import slots, held while an import is read, parsed and
        stored; none free is a 503 with Retry-After at once (an import costs memory for its whole body)."""
        if self._imports >= self.limits.max_concurrent_imports:
            raise ApiError(503, f"{self._imports} imports are running (the limit); retry shortly",
                           {"Retry-After": "1"})
        self._imports += 1
        try:
            yield
        finally:
            self._imports -= 1

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

    def search(self, user_id: str, question: str, when: str | None, limit: int | None = None,
               filters: Filters | None = None) -> dict[str, Any]:
        """The activated working memory of ``question`` (no graph features, no LM). ``filters``: only the
        units they keep are activated (a memory over those units, their traces regrouped among them), so
        the filter applies before the top k is taken."""
        from qgmem.activation.serialize import serialize_graph_triples
        from qgmem.prompting import memory_with_graph_text
        from qgmem.serving.records import graph_json, unit_json

        started = time.perf_counter()
        with self.users.hold(user_id) as user:
            units = len(user.store)
            source = self.users.filtered(user, filters) if filters else user.memory
            memory, store = source.activate(question, when), source.store
        seconds = time.perf_counter() - started
        ranked = list(zip(memory.units, memory.scores or [0.0] * len(memory.units)))[:limit]
        triples = serialize_graph_triples(memory.graph)
        return {"user": user_id, "question": question, "time": when, "store_units": units,
                **({"matching_units": len(store)} if filters else {}),
                "units": [{"label": f"M{i + 1}", **unit_json(u, store.trace_of(u)),
                           "score": round(float(score), 4)} for i, (u, score) in enumerate(ranked)],
                "graph": graph_json(memory.graph), "graph_text": triples,
                "memory_text": memory_with_graph_text(memory.text, triples),
                "seconds": {"activation": seconds}}

    def memories(self, user_id: str, offset: int, limit: int, filters: Filters | None = None) -> dict[str, Any]:
        """The user's units in store order, paged; ``filters`` pick them first (``total`` counts those)."""
        from qgmem.serving.records import unit_json

        with self.users.hold(user_id) as user:
            store = user.store
            units = [u for u in store.units if filters.keeps(u)] if filters else store.units
            page = [unit_json(u, store.trace_of(u)) for u in units[offset:offset + limit]]
            return {"user": user_id, "total": len(units), "offset": offset, "limit": limit, "units": page,
                    "sessions": session_count(store)}

    def check_queue(self) -> None:
        """A 503 with Retry-After when the LM's queue is full (before the question is activated)."""
        if self.batcher.depth() >= self.batcher.queue.maxsize:
            raise ApiError(503, "too many questions are waiting; retry shortly", {"Retry-After": "1"})

    def submit(self, retrieved, graph_mode: str | None, on_text=None):
        """The batcher's future of ``(Answer, batch size)`` (``graph_mode`` ``None``: the export's default
        graph mode); a full queue is a 503."""
        graph_mode = self.pipeline.contract.graph_mode if graph_mode is None else graph_mode
        try:
            return self.batcher.submit(retrieved, graph_mode, on_text)
        except QueueFull:
            raise ApiError(503, "too many questions are waiting; retry shortly", {"Retry-After": "1"}) from None

    def observe(self, answer) -> None:
        """An answer's seconds per stage into the metrics."""
        for stage in STAGES:
            if stage in answer.seconds:
                self.metrics.observe(stage, answer.seconds[stage])
        self.metrics.queue.set(self.batcher.depth())

    def count_loaded(self) -> None:
        self.metrics.users.set(self.users.loaded())
        self.metrics.units.set(self.users.units())

    def private(self, message: str) -> str:
        """``message`` with the SQLite file's folder taken out (a 500 never shows the machine's paths)."""
        path = getattr(self.users.store, "path", None)
        if path is not None:
            for prefix in sorted({str(path.parent.resolve()), str(path.parent.absolute()), str(path.parent)},
                                 key=len, reverse=True):
                message = message.replace(prefix.rstrip(os.sep) + os.sep, "")
        return message

    def close(self) -> None:
        self.batcher.close()
        self.users.close()


# ------------------------------------------------------------------------------------------- app
def create_app(service: MemoryService, api_key: str | None = None):
    """The FastAPI app over ``service``: the users, chat and operations routers, the key check, metrics per
    route and the error shape. ``api_key``: the bearer key every request but /healthz needs."""
    from fastapi import FastAPI, Request
    from starlette.concurrency import run_in_threadpool

    from qgmem.serving.mcp import mount as mount_mcp
    from qgmem.serving.routes import chat, operations, users
    from qgmem.serving.routes.common import error

    logging.getLogger("uvicorn.access").addFilter(_NO_QUERY)  # whoever runs the app: no query strings logged

    @asynccontextmanager
    async def lifespan(app):
        gc.freeze()  # the models' millions of objects leave the collector's walks: a large body's parse pauses less
        sweeper = None
        if service.users.idle_unload_s is not None:
            sweeper = asyncio.ensure_future(_sweep(service, min(30.0, max(0.05, service.users.idle_unload_s / 2))))
        async with mcp_sessions.run():
            yield
        if sweeper is not None:
            sweeper.cancel()
        await run_in_threadpool(service.close)

    app = FastAPI(title="qgmem", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url="/openapi.json")
    metrics, key = service.metrics, api_key.encode() if api_key else None

    def authorized(header: str) -> bool:
        scheme, _, token = header.strip().partition(" ")  # the scheme is case-insensitive (RFC 7235)
        return scheme.lower() == "bearer" and hmac.compare_digest(token.strip().encode(), key)

    @app.middleware("http")
    async def guard(request: Request, call_next):
        started = time.perf_counter()
        if key is not None and request.url.path != "/healthz" and not authorized(request.headers.get("authorization", "")):
            metrics.refused.inc()  # one series, whatever the path: a client without the key adds no label
            return error(401, "missing or wrong bearer key (header 'Authorization: Bearer <key>')")
        try:
            response = await call_next(request)
        except Exception:  # noqa: BLE001 - a bug: logged (no request content), the server lives on
            log.exception("internal error on %s %s", request.method, _route(request))
            response = error(500, "internal error")
        route = _route(request)
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
        return error(404 if isinstance(exc, (UnknownUser, UnknownUnit)) else
                     409 if isinstance(exc, (IdempotencyConflict, UserExists)) else 400, message)

    @app.exception_handler(StoreUnavailable)
    async def store_unavailable(request: Request, exc: StoreUnavailable):
        log.error("%s", exc)  # the database is down or restarting: the client retries, the server lives on
        return error(503, str(exc), {"Retry-After": "1"})

    @app.exception_handler(StoreFull)
    async def store_full(request: Request, exc: StoreFull):
        log.error("%s", exc)
        return error(507, str(exc))

    @app.exception_handler(404)
    async def not_found(request: Request, exc):
        return error(404, f"no endpoint {request.method} {request.url.path[:100]}")

    @app.exception_handler(405)
    async def not_allowed(request: Request, exc):
        return error(405, f"{request.method} is not allowed on {request.url.path[:100]}")

    for routes in (users, chat, operations):
        app.include_router(routes.router(service))
    mcp_sessions = mount_mcp(app, service)  # streamable HTTP at /mcp, behind the same key

    def openapi() -> dict:
        """FastAPI's schema with the request models the routes check themselves (their bodies are read
        bounded and timed, so FastAPI does not parse them and would not list them)."""
        if app.openapi_schema is None:
            from fastapi.openapi.utils import get_openapi

            from qgmem.serving.routes.protocol import request_schemas

            schema = get_openapi(title=app.title, version=app.version, routes=app.routes)
            schema.setdefault("components", {}).setdefault("schemas", {}).update(request_schemas())
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi
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


def _route(request) -> str:
    """The matched route's template (``/v1/users/{user_id}/answer``): user ids and unknown paths are never
    metric labels, so no client can add series (every unmatched path is ``unmatched``)."""
    return getattr(request.scope.get("route"), "path", None) or "unmatched"
