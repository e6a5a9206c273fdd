"""``/v1/users/{user_id}/…``: a user's memory (sessions appended one at a time or in a batch, answers,
search, memories, one memory forgotten, export and import, deletion)."""

import asyncio
import json
import re
from typing import Any

from qgmem.serving.requests import (EXPORT_FORMAT, EXPORT_VERSION, FILTER_FIELDS, bad, check_filters,
                                    check_unit_id, query_integer, query_params)
from qgmem.serving.routes import protocol as p
from qgmem.serving.routes.common import activate, check_id, in_thread, read_json
from qgmem.serving.users import UnknownUser

#: what an Idempotency-Key may be (it is stored in the user's journal)
IDEMPOTENCY_KEY = re.compile(r"[\x21-\x7e]{1,200}")
#: units per page of GET /v1/users/{id}/memories at most, and the largest offset
MAX_PAGE, MAX_OFFSET = 1000, 1_000_000_000


def idempotency_key(request: Any) -> str | None:
    key = request.headers.get("idempotency-key")
    if key is not None and not IDEMPOTENCY_KEY.fullmatch(key):
        raise bad("header 'Idempotency-Key' must be 1 to 200 visible ASCII characters")
    return key


def router(service: Any):
    from fastapi import APIRouter, Request
    from fastapi.responses import StreamingResponse

    routes, limits = APIRouter(prefix="/v1/users/{user_id}"), service.limits

    def acknowledged(result: dict) -> dict:
        """An append's reply; its stage times are observed once (a replayed key stored nothing new)."""
        if not result.get("replayed"):
            for stage, seconds in result["seconds"].items():
                service.metrics.observe(f"append_{stage}", seconds)
        service.count_loaded()
        return result

    @routes.post("/sessions", **p.route(p.Appended, p.Session))
    async def append_session(user_id: str, request: Request):
        check_id(user_id)
        key = idempotency_key(request)
        turns, session_time = p.validate(p.Session, await read_json(request, limits), limits).plain()
        result = await in_thread(service.users.append, user_id, turns, session_time, key)
        return acknowledged(result)

    @routes.post("/sessions/batch", **p.route(p.BatchAppended, p.Batch))
    async def append_batch(user_id: str, request: Request):
        check_id(user_id)
        key = idempotency_key(request)
        sessions = [s.plain() for s in p.validate(p.Batch, await read_json(request, limits), limits).sessions]
        result = await in_thread(service.users.append_batch, user_id, sessions, key)
        return acknowledged(result)

    @routes.post("/answer", **p.route(p.AnswerResult, p.AnswerRequest))
    async def answer(user_id: str, request: Request):
        check_id(user_id)
        asked = p.validate(p.AnswerRequest, await read_json(request, limits), limits)
        cap = min(asked.max_tokens or service.max_new_tokens, service.max_new_tokens)
        retrieved = await activate(service, user_id, asked.question, asked.time, cap)
        result, batch = await asyncio.wrap_future(service.submit(retrieved, asked.graph_mode))
        service.observe(result)
        return {"user": user_id, **result.to_dict(), "batch_size": batch}

    @routes.post("/search", **p.route(p.SearchResult, p.SearchRequest))
    async def search(user_id: str, request: Request):
        check_id(user_id)
        asked = p.validate(p.SearchRequest, await read_json(request, limits), limits)
        result = await in_thread(service.search, user_id, asked.question, asked.time, asked.limit, asked.filters())
        service.metrics.observe("activation", result["seconds"]["activation"])
        return result

    @routes.get("/memories", **p.route(p.Memories))
    async def memories(user_id: str, request: Request):
        check_id(user_id)
        query = query_params(request.query_params.multi_items(), ("offset", "limit", *FILTER_FIELDS))
        listed = {**query, **({"sessions": query["sessions"].split(",")} if "sessions" in query else {})}
        return await in_thread(service.memories, user_id, query_integer(query, "offset", 0, MAX_OFFSET, 0),
                               query_integer(query, "limit", 1, MAX_PAGE, 100),
                               check_filters(listed, "query parameter"))

    @routes.delete("/memories/{unit_id}", **p.route(p.Forgotten))
    async def forget(user_id: str, unit_id: str):
        check_id(user_id)
        result = await in_thread(service.users.forget, user_id, check_unit_id(unit_id))
        service.count_loaded()
        return result

    @routes.get("/export", **p.route(p.ExportDocument))
    async def export(user_id: str):
        check_id(user_id)
        entries = await in_thread(service.users.export, user_id)  # an unknown user is a 404 before the stream
        return StreamingResponse(export_document(user_id, entries), media_type="application/json")

    @routes.post("/import", **p.route(p.Imported, p.ExportDocument))
    async def import_user(user_id: str, request: Request):
        check_id(user_id)
        with service.importing():
            body = await read_json(request, limits, limits.max_import_bytes)
            entries = await in_thread(p.import_entries, body, limits)
            result = await in_thread(service.users.import_user, user_id, entries)
        service.count_loaded()
        return result

    @routes.delete("", **p.route(p.Deleted))
    async def delete_user(user_id: str):
        check_id(user_id)
        if not await in_thread(service.users.delete, user_id):
            raise UnknownUser(f"no memory for user {user_id!r}")
        service.count_loaded()
        return {"user": user_id, "deleted": True}

    return routes


def export_document(user_id: str, entries) -> Any:
    """The export as JSON text, piece by piece: ``{"format", "version", "user", "entries": [...]}``, one
    entry per line, so a large user is never held whole."""
    yield json.dumps({"format": EXPORT_FORMAT, "version": EXPORT_VERSION, "user": user_id})[:-1] + ', "entries": ['
    for i, entry in enumerate(entries):
        yield ("," if i else "") + "\n" + json.dumps(entry, ensure_ascii=False)
    yield "\n]}\n"
