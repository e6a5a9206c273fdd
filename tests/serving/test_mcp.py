"""The MCP tools with the SDK's own client, over streamable HTTP (``/mcp`` on ``qgmem serve``'s app,
behind its key) and over stdio (``qgmem mcp``)."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("mcp")

from qgmem.serving.server import create_app

from .server_helpers import running
from .test_server import _service, pipeline  # noqa: F401  (fixture)

TOOLS = {"remember", "search", "answer", "list_memories", "forget"}
FACT = [{"speaker": "User", "text": "My favourite colour is teal and I paint my boat teal every spring."}]


def _data(result) -> dict:
    assert not result.is_error, result.content
    return json.loads(result.content[0].text)


async def _round_trip(client) -> None:
    """List the tools, remember a fact, find it, forget it, and see it gone; a bad argument is an error."""
    assert TOOLS <= {tool.name for tool in (await client.list_tools()).tools}
    stored = _data(await client.call_tool("remember", {"user_id": "ana", "turns": FACT, "time": "2024-05-01"}))
    assert stored["units_added"] > 0
    found = _data(await client.call_tool("search", {"user_id": "ana", "question": "What colour is my boat?", "k": 3}))
    teal = [u for u in found["units"] if "teal" in u["fact"]]
    assert teal
    listed = _data(await client.call_tool("list_memories", {"user_id": "ana"}))
    assert listed["total"] == stored["units"]
    for unit in teal:
        _data(await client.call_tool("forget", {"user_id": "ana", "unit_id": unit["unit_id"]}))
    after = _data(await client.call_tool("list_memories", {"user_id": "ana"}))
    assert not any("teal" in u["fact"] for u in after["units"])
    bad = await client.call_tool("remember", {"user_id": "ana", "turns": [{"speaker": "User"}]})
    assert bad.is_error and "turns[0]: field 'text'" in bad.content[0].text
    bad = await client.call_tool("forget", {"user_id": "ana", "unit_id": "a/b"})
    assert bad.is_error and "argument 'unit_id'" in bad.content[0].text
    bad = await client.call_tool("search", {"user_id": "ana", "question": "q", "k": "three"})
    assert bad.is_error and "\nk\n" in bad.content[0].text  # the SDK's own check of the arguments' types
    bad = await client.call_tool("search", {"user_id": "ana", "question": "q", "k": 0})
    assert bad.is_error and "argument 'k'" in bad.content[0].text
    bad = await client.call_tool("search", {"user_id": "../x", "question": "q"})
    assert bad.is_error and "argument 'user_id'" in bad.content[0].text


def test_mcp_over_streamable_http_behind_the_key(pipeline, tmp_path):  # noqa: F811
    import httpx2
    from mcp.client.client import Client
    from mcp.client.streamable_http import streamable_http_client

    async def run(url: str) -> None:
        async with httpx2.AsyncClient(headers={"Authorization": "Bearer k3y"}, timeout=60) as http:
            async with Client(streamable_http_client(f"{url}/mcp", http_client=http)) as client:
                await _round_trip(client)

    with running(create_app(_service(pipeline, tmp_path), api_key="k3y")) as url:
        assert httpx2.post(f"{url}/mcp", json={}).status_code == 401
        asyncio.run(run(url))


@pytest.mark.slow
def test_mcp_over_stdio(tiny_lm_path, tmp_path):
    from mcp.client.client import Client
    from mcp.client.stdio import StdioServerParameters, stdio_client

    from qgmem.memory.config import ConstructionConfig

    from .helpers import make_export

    export = make_export(tmp_path / "export", tiny_lm_path, feature_dim=384,
                         construction=ConstructionConfig(extractor="heuristic").to_dict())
    src = str(Path(__file__).resolve().parents[2] / "src")
    env = {**os.environ, "PYTHONPATH": src + os.pathsep + os.environ.get("PYTHONPATH", ""), "OMP_NUM_THREADS": "1"}
    params = StdioServerParameters(command=sys.executable, env=env, args=[
        "-m", "qgmem", "mcp", "--export", str(export), "--store", f"sqlite:///{tmp_path / 'memories' / 'memories.db'}", "--threads", "1"])

    async def run() -> None:
        async with Client(stdio_client(params)) as client:
            await _round_trip(client)

    asyncio.run(run())
