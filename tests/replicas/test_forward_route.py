"""A forwarding replica's client against an owner's internal route, both real (uvicorn on loopback)."""

from __future__ import annotations

import contextlib
import socket
from collections.abc import AsyncIterator
from typing import Any

import anyio
import mcp_types as types
import pytest
import uvicorn

from mcp_sandbox.replicas.forward import Forwarder
from mcp_sandbox.replicas.signing import Verifier
from mcp_sandbox.server.routes.internal import with_internal_route

pytestmark = pytest.mark.anyio

KEY = b"k" * 32
BOUND = 10.0


async def _nothing_else(scope: Any, receive: Any, send: Any) -> None:
    await send({"type": "http.response.start", "status": 404, "headers": []})
    await send({"type": "http.response.body", "body": b""})


@contextlib.asynccontextmanager
async def owner(calls: list[dict[str, Any] | None]) -> AsyncIterator[str]:
    listening = socket.create_server(("127.0.0.1", 0))  # listening before the server starts: no wait
    url = f"http://127.0.0.1:{listening.getsockname()[1]}"

    async def serve(tool: str, arguments: dict[str, Any] | None, tenant: str) -> types.CallToolResult:
        calls.append(arguments)
        await anyio.sleep(0.05)  # both calls are in flight at once
        return types.CallToolResult(content=[types.TextContent(type="text", text="ran")])

    app = with_internal_route(_nothing_else, url, Verifier(KEY), "default".__eq__, serve, 1 << 20)
    server = uvicorn.Server(uvicorn.Config(app, lifespan="off", log_level="warning"))
    with listening:
        async with anyio.create_task_group() as group:
            group.start_soon(server.serve, [listening])
            yield url
            server.should_exit = True


async def test_two_identical_calls_forwarded_at_once_both_run_and_neither_is_taken_for_a_replay() -> None:
    calls: list[dict[str, Any] | None] = []
    results: list[types.CallToolResult] = []
    async with owner(calls) as url:
        forwarder = Forwarder("http://127.0.0.1:1", KEY, BOUND)
        try:

            async def forward() -> None:
                results.append(await forwarder.forward(url, "run_python", {"code": "print(1)"}, "default"))

            with anyio.fail_after(BOUND):
                await forward()  # a kept-alive connection: the next call is signed and sent at once
                async with anyio.create_task_group() as group:
                    group.start_soon(forward)
                    group.start_soon(forward)  # the same body, signed in the same millisecond
        finally:
            await forwarder.aclose()

    assert [result.is_error for result in results] == [False] * 3, results
    assert calls == [{"code": "print(1)"}] * 3
