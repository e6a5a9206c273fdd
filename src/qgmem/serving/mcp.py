"""The memory service as MCP tools (the official ``mcp`` SDK's ``MCPServer``): ``remember``, ``search``,
``answer``, ``list_memories`` and ``forget``.

Each tool calls the same :class:`~qgmem.serving.server.MemoryService` as the HTTP routes, with the same
request models (:mod:`qgmem.serving.routes.protocol`) and limits, so isolation, bounds and durability
are the HTTP routes' own. A bad argument is a tool error naming it (the 4xx message of the route), not a
crash. Two transports: stdio (``qgmem mcp``) and streamable HTTP at ``/mcp`` on ``qgmem serve``
(:func:`mount`, behind the same bearer key).
"""

from __future__ import annotations

import asyncio
from typing import Any

from qgmem.errors import UserError
from qgmem.serving.requests import ApiError, check_unit_id
from qgmem.serving.routes import protocol as p
from qgmem.serving.routes.users import MAX_PAGE as MAX_PAGE_UNITS
from qgmem.serving.users import BadUserId, check_user_id


def mcp_server(service: Any):
    """An ``MCPServer`` whose tools read and write ``service``'s memories."""
    from mcp.server.mcpserver import MCPServer
    from mcp.server.mcpserver.exceptions import ToolError

    server = MCPServer(name="qgmem", instructions=(
        "Long-term conversational memory per user: remember a session of turns, search the memory "
        "(ranked units with ids), answer a question from it, list and forget units."))
    limits = service.limits

    async def call(function, *args):
        """``function(*args)`` in a worker thread; a refused request is a tool error with its message."""
        try:
            return await asyncio.to_thread(function, *args)
        except (ApiError, UserError) as exc:
            raise ToolError(service.private(getattr(exc, "message", str(exc)))) from None

    def checked(model, body: dict[str, Any]):
        try:
            return p.validate(model, body, limits)
        except ApiError as exc:
            raise ToolError(exc.message) from None

    def user(user_id: str) -> str:
        try:
            return check_user_id(user_id)
        except BadUserId as exc:
            raise ToolError(f"argument 'user_id': {exc}") from None

    @server.tool()
    async def remember(user_id: str, turns: list[dict[str, Any]], time: str | None = None) -> dict[str, Any]:
        """Append one session to the user's memory (a new user is created); each turn is
        {"speaker", "text", "time"?}. Returns once the session is durable."""
        session = checked(p.Session, {"turns": turns, **({"time": time} if time is not None else {})})
        plain, when = session.plain()
        return await call(service.users.append, user(user_id), plain, when, None)

    @server.tool()
    async def search(user_id: str, question: str, k: int | None = None) -> dict[str, Any]:
        """The user's working memory for the question: ranked units with their ids, times and scores,
        and the memory as text; no LM call."""
        if k is not None and not 1 <= k <= p.MAX_SEARCH_UNITS:
            raise ToolError(f"argument 'k' must be from 1 to {p.MAX_SEARCH_UNITS}, got {k}")
        asked = checked(p.SearchRequest, {"question": question, **({"limit": k} if k is not None else {})})
        return await call(service.search, user(user_id), asked.question, asked.time, asked.limit, None)

    @server.tool()
    async def answer(user_id: str, question: str) -> dict[str, Any]:
        """The answer to the question from the user's memory, with the memory units it cites."""
        asked = checked(p.AnswerRequest, {"question": question})
        name = user(user_id)
        try:
            service.check_queue()
        except ApiError as exc:
            raise ToolError(exc.message) from None
        retrieved = await call(service.retrieve, name, asked.question, None, service.max_new_tokens)
        try:
            result, _ = await asyncio.wrap_future(service.submit(retrieved, None))
        except (ApiError, UserError) as exc:
            raise ToolError(service.private(getattr(exc, "message", str(exc)))) from None
        service.observe(result)
        return {"user": name, "question": result.question, "answer": result.answer, "cited": result.cited,
                "memory": result.memory}

    @server.tool()
    async def list_memories(user_id: str, limit: int = 100, offset: int = 0) -> dict[str, Any]:
        """The user's memory units in store order, paged (limit 1..1000)."""
        if not 1 <= limit <= MAX_PAGE_UNITS:
            raise ToolError(f"argument 'limit' must be from 1 to {MAX_PAGE_UNITS}, got {limit}")
        if offset < 0:
            raise ToolError(f"argument 'offset' must be >= 0, got {offset}")
        return await call(service.memories, user(user_id), offset, limit, None)

    @server.tool()
    async def forget(user_id: str, unit_id: str) -> dict[str, Any]:
        """Forget one memory unit (its id as search or list_memories show it)."""
        try:
            unit = check_unit_id(unit_id, "argument 'unit_id'")
        except ApiError as exc:
            raise ToolError(exc.message) from None
        return await call(service.users.forget, user(user_id), unit)

    return server


def mount(app: Any, service: Any):
    """Streamable HTTP at ``/mcp`` on ``app`` (stateless, JSON replies; bodies bounded like the routes');
    returns the session manager, whose ``run()`` the app's lifespan holds open."""
    from mcp.server.lowlevel.server import StreamableHTTPASGIApp
    from mcp.server.transport_security import TransportSecuritySettings
    from starlette.routing import Route

    server = mcp_server(service)
    server.streamable_http_app(stateless_http=True, json_response=True,
                               max_request_body_size=service.limits.max_body_bytes,
                               transport_security=TransportSecuritySettings(enable_dns_rebinding_protection=False))
    manager = server.session_manager
    app.router.routes.append(Route("/mcp", endpoint=StreamableHTTPASGIApp(manager), methods=["GET", "POST", "DELETE"]))
    return manager
