"""A run whose client cancels or hangs up ends at once, on every path, through real clients.

Each run starts a ``sleep`` with a marker argument (a process the host can see by its command
line) and then sleeps itself. The client gives up: the MCP Python SDK's cancel (in-memory and
over stdio), an HTTP client that hangs up on a plain-JSON ``tools/call``. Within a bound well
under the run's own timeout no process of the run may remain, the warm pool must be back to its
size, and with ``max_concurrent_runs = 1`` the next run must be admitted and finish.
"""

from __future__ import annotations

import functools
import json
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import httpx2
import pytest
from mcp import Client

from mcp_sandbox.config import load_settings
from mcp_sandbox.engine import Engine
from mcp_sandbox.server.app import build_server
from mcp_sandbox.server.service import open_service
from mcp_test_helpers import CALL_BOUND, http_server, own_processes, poll, run_python, stdio_client, structured

pytestmark = [pytest.mark.e2e, pytest.mark.sandbox, pytest.mark.anyio]

TOKEN = "cancel-token-0123456789abcdef"
RUN_TIMEOUT = 60  # the run's own limit: far beyond every bound below
GONE_BOUND = 5.0  # the run's processes gone after the cancel (it takes well under a second)
START_BOUND = 30.0  # the run's marker process seen
# One run at a time, a short queue and one warm sandbox: a slot or a sandbox kept by a cancelled
# run shows as a refused (busy) or cold next run.
ONE_SLOT = {
    "MCP_SANDBOX_MAX_CONCURRENT_RUNS": "1",
    "MCP_SANDBOX_QUEUE_TIMEOUT": "5",
    "MCP_SANDBOX_POOL_SIZE": "1",
    "MCP_SANDBOX_POOL_MIN": "1",
}


def sleeper(marker: str) -> str:
    """Code that leaves a process with ``marker`` on its command line, then sleeps past every bound."""
    return f"import subprocess, time\nsubprocess.Popen(['sleep', '{marker}'])\ntime.sleep({RUN_TIMEOUT})\n"


def new_marker() -> str:
    """A ``sleep`` argument no other test uses: 600 s and a random fraction."""
    return f"600.{uuid.uuid4().int % 10**9:09d}"


async def cancelled_after_start(call: Callable[[], Any], marker: str) -> None:
    """Make ``call``, cancel it once the run's marker process is up; return once it is cancelled."""
    async with anyio.create_task_group() as group:
        group.start_soon(call)
        with anyio.fail_after(START_BOUND):
            await poll(lambda: bool(own_processes(marker)))
        group.cancel_scope.cancel()


async def assert_gone(marker: str) -> None:
    with anyio.fail_after(GONE_BOUND):
        await poll(lambda: not own_processes(marker))


@asynccontextmanager
async def served(state_dir: Path, runtime: Path | None) -> AsyncIterator[tuple[Client, Engine]]:
    """The whole service in this process with one warm sandbox and one run slot, and an in-memory client."""
    values: dict[str, Any] = {
        "state_dir": str(state_dir),
        "discover_servers": False,
        "pool_size": 1,
        "pool_min": 1,
        "max_concurrent_runs": 1,
        "queue_timeout": 5.0,
    }
    if runtime is not None:
        values["python_runtime"] = str(runtime)
    settings = load_settings(env={}, flags=values)
    async with (
        open_service(settings, http=False) as service,
        Client(build_server(service), read_timeout_seconds=CALL_BOUND) as client,
    ):
        yield client, service.engine


async def test_a_cancelled_warm_run_is_killed_and_its_sandbox_replaced(
    state_dir: Path, sandbox_runtime: Path | None
) -> None:
    async with served(state_dir, sandbox_runtime) as (client, engine):
        warm = structured(await run_python(client, {"code": "print('ready')"}))
        assert warm["stdout"] == "ready\n"
        for _ in range(3):  # a leak would show as a pool growing past its size or a slot held
            marker = new_marker()
            arguments = {"code": sleeper(marker), "timeout": RUN_TIMEOUT}
            await cancelled_after_start(functools.partial(client.call_tool, "run_python", arguments), marker)
            await assert_gone(marker)
            assert engine.admission.running == 0
            with anyio.fail_after(CALL_BOUND):
                await poll(lambda: engine.pool.size == 1 and engine.pool.idle == 1)
            after = structured(await run_python(client, {"code": "print('next')"}))
            assert after["status"] == "success" and after["stdout"] == "next\n"
        assert engine.pool.size == 1


async def test_a_run_cancelled_by_a_stdio_client_ends(state_dir: Path, sandbox_runtime: Path | None) -> None:
    async with stdio_client(state_dir, sandbox_runtime, environment=ONE_SLOT) as client:
        marker = new_marker()
        arguments = {"code": sleeper(marker), "timeout": RUN_TIMEOUT}
        await cancelled_after_start(lambda: client.call_tool("run_python", arguments), marker)
        await assert_gone(marker)
        after = structured(await run_python(client, {"code": "print('next')"}))
        assert after["status"] == "success" and after["stdout"] == "next\n"


def tools_call(code: str, conversation: str | None = None) -> dict[str, Any]:
    arguments: dict[str, Any] = {"code": code, "timeout": RUN_TIMEOUT}
    if conversation is not None:
        arguments["conversationId"] = conversation
    return {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "run_python", "arguments": arguments}}


@pytest.mark.parametrize("conversation", [None, "cancel-conversation"], ids=["warm", "session"])
async def test_a_plain_json_client_that_hangs_up_ends_its_run(
    state_dir: Path, sandbox_runtime: Path | None, conversation: str | None
) -> None:
    env = {**ONE_SLOT, "MCP_SANDBOX_TOKEN": TOKEN}
    headers = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"}
    async with http_server(state_dir, env=env, runtime=sandbox_runtime) as base:
        async with httpx2.AsyncClient(headers=headers, timeout=RUN_TIMEOUT + 30) as web:
            marker = new_marker()
            body = tools_call(sleeper(marker), conversation)
            await cancelled_after_start(lambda: web.post(f"{base}/mcp", json=body), marker)
        await assert_gone(marker)
        async with httpx2.AsyncClient(headers=headers, timeout=CALL_BOUND) as web:
            reply = await web.post(f"{base}/mcp", json=tools_call("print('next')", conversation))
        assert reply.status_code == 200
        result = json.loads(reply.text)["result"]["structuredContent"]
        assert result["status"] == "success" and result["stdout"] == "next\n"
