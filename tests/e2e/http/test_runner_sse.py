"""The earlier code runner's SSE routes: an HTTP+SSE client (the 2024-11-05 transport) at ``/mcp``.

That runner's clients opened their stream with ``GET /mcp`` ("establish SSE stream") or
``GET /mcp/events``. Both open the deprecated HTTP+SSE transport here, beside Streamable HTTP
at ``/mcp``, whose clients keep their sessions (a GET that names a session, or that accepts JSON
too, is still Streamable HTTP's).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path

import anyio
import httpx2
import pytest
from mcp import Client
from mcp.client.sse import sse_client

from mcp_test_helpers import CALL_BOUND, http_client, http_server

pytestmark = [pytest.mark.e2e, pytest.mark.anyio]

TOKEN = "runner-token-0123456789abcdef"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


@pytest.fixture(scope="module")
async def base(module_state_dir: Path, sandbox_runtime: Path | None) -> AsyncIterator[str]:
    async with http_server(module_state_dir, env={"MCP_API_TOKEN": TOKEN}, runtime=sandbox_runtime) as url:
        yield url


@pytest.mark.parametrize("path", ["/mcp", "/mcp/events"])
async def test_an_sse_client_pointed_at_the_runners_routes_initializes_lists_and_runs(base: str, path: str) -> None:
    async with Client(sse_client(f"{base}{path}", headers=AUTH), read_timeout_seconds=CALL_BOUND) as client:
        with anyio.fail_after(CALL_BOUND * 2):
            tools = {tool.name for tool in (await client.list_tools()).tools}
            assert {"run_code", "upload_file", "list_runners"} <= tools
            result = await client.call_tool("run_code", {"language": "python", "code": "print(6 * 7)"})
    assert not result.is_error
    assert result.structured_content is not None
    assert result.structured_content["stdout"] == "42\n"
    text = json.loads(result.content[0].text)  # type: ignore[union-attr]
    assert text == {"success": True, "output": "42\n", "files": []}


async def test_the_sse_stream_at_mcp_starts_with_the_endpoint_event_and_needs_the_token(base: str) -> None:
    async with httpx2.AsyncClient(timeout=CALL_BOUND) as web:
        refused = await web.get(f"{base}/mcp", headers={"Accept": "text/event-stream"})
        assert refused.status_code == 401
        with anyio.fail_after(CALL_BOUND):
            async with web.stream("GET", f"{base}/mcp", headers={**AUTH, "Accept": "text/event-stream"}) as stream:
                assert stream.status_code == 200
                assert stream.headers["content-type"].startswith("text/event-stream")
                first = b""
                async for chunk in stream.aiter_bytes():
                    first += chunk
                    if b"\n\n" in first or b"\r\n\r\n" in first:
                        break
    event = first.decode().replace("\r\n", "\n").split("\n\n")[0].splitlines()
    assert event[0] == "event: endpoint"
    assert event[1].startswith("data: /messages/?session_id=")


async def test_streamable_http_keeps_its_get_and_sessions_beside_the_sse_handshake(base: str) -> None:
    async with httpx2.AsyncClient(timeout=CALL_BOUND, headers=AUTH) as web:
        # A Streamable HTTP client's GET without a session (it accepts JSON too) is still that transport's error.
        missing = await web.get(f"{base}/mcp", headers={"Accept": "application/json, text/event-stream"})
    assert missing.status_code == 400
    assert "mcp-session-id" not in missing.headers
    async with http_client(base, TOKEN) as client:
        with anyio.fail_after(CALL_BOUND * 2):
            result = await client.call_tool("run_code", {"language": "python", "code": "print(1)"})
    assert result.structured_content is not None
    assert result.structured_content["stdout"] == "1\n"
