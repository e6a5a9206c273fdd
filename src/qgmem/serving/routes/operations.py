"""``/healthz`` (no key needed) and ``/metrics`` (Prometheus)."""

from typing import Any


def router(service: Any):
    from fastapi import APIRouter
    from fastapi.responses import PlainTextResponse
    from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

    from qgmem.serving.routes import protocol as p

    routes = APIRouter()

    @routes.get("/healthz", **p.route(p.Health))
    async def healthz():
        batcher = service.batcher
        return {"status": "ok", "users_loaded": service.users.loaded(), "queue": batcher.depth(),
                "batches": batcher.batches, "batched_questions": batcher.batched_questions}

    @routes.get("/metrics")
    async def prometheus():
        service.metrics.queue.set(service.batcher.depth())
        return PlainTextResponse(generate_latest(service.metrics.registry), media_type=CONTENT_TYPE_LATEST)

    return routes
