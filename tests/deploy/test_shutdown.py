"""Shutdown as an operator does it: SIGTERM, a second SIGTERM or SIGINT, and SIGTERM during start-up.

A real ``mcp-sandbox serve --transport http`` process (tests/deploy/test_service.py's), its runs
made by the SDK's client over Streamable HTTP and by plain JSON over HTTP, signals sent to it.
A run still going when the server stops must get a tool result saying so (not an HTTP 500), a
second signal must not wait for the grace, uploads must be refused while draining, and a SIGTERM
that comes before the server listens must still stop it in order (exit 0).
"""

from __future__ import annotations

import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio
import httpx2
import pytest
from mcp.types import CallToolResult

from mcp_test_helpers import CALL_BOUND, _server_env, _stop_server, free_port, http_client, poll, upload

from .test_service import ALICE, Server, call, data, metric, server, until

pytestmark = [pytest.mark.e2e, pytest.mark.anyio]

SLEEPER = "import time\nprint('begun', flush=True)\ntime.sleep(120)\n"
STOPPED = "server stopped"
EXIT_BOUND = 30.0  # the process gone after the last signal


async def running(web: httpx2.AsyncClient, live: Server, count: int = 1) -> None:
    async def check() -> bool:
        return await metric(web, live.base, "mcp_sandbox_runs_running") >= count

    await until(check)


async def draining(web: httpx2.AsyncClient, live: Server) -> None:
    async def check() -> bool:
        return (await web.get(f"{live.base}/readyz")).status_code == 503

    await until(check, 10)


async def plain_run(web: httpx2.AsyncClient, live: Server, code: str) -> dict[str, Any]:
    """A ``tools/call`` of run_python as plain JSON (curl's way); the reply's result."""
    body = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "tools/call",
        "params": {"name": "run_python", "arguments": {"code": code}},
    }
    reply = await web.post(f"{live.base}/mcp", json=body, headers={"Authorization": f"Bearer {ALICE}"})
    assert reply.status_code == 200, (reply.status_code, reply.text)
    result: dict[str, Any] = reply.json()["result"]
    return result


async def with_two_long_runs(live: Server, signals: Callable[[httpx2.AsyncClient], Awaitable[None]]) -> list[Any]:
    """Start a long run through the SDK and one as plain JSON, then ``signals``; both answers."""
    answers: list[Any] = [None, None]
    async with (
        http_client(live.base, ALICE) as client,
        httpx2.AsyncClient(timeout=CALL_BOUND * 4) as web,
    ):
        await client.list_tools()  # the SDK lists them before it accepts a result: not from a stopping server

        async def sdk() -> None:
            answers[0] = await call(client, "run_python", {"code": SLEEPER, "timeout": 120})

        async def plain() -> None:
            answers[1] = await plain_run(web, live, SLEEPER)

        with anyio.fail_after(CALL_BOUND * 4):
            async with anyio.create_task_group() as group:
                group.start_soon(sdk)
                group.start_soon(plain)
                await running(web, live, 2)
                await signals(web)
    return answers


def assert_stopped(sdk: CallToolResult, plain: dict[str, Any]) -> None:
    assert sdk.is_error and data(sdk)["status"] == "error" and STOPPED in data(sdk)["error"], sdk
    structured = plain["structuredContent"]
    assert plain["isError"] and structured["status"] == "error" and STOPPED in structured["error"], plain


async def exited(live: Server) -> float:
    """Wait for the server's exit; its exit code must be 0. How long it took."""
    started = time.monotonic()
    with anyio.fail_after(EXIT_BOUND):
        await live.process.wait()
    assert live.process.returncode == 0
    return time.monotonic() - started


async def test_runs_still_going_when_the_grace_ends_are_answered_that_the_server_stopped(
    state_dir: Path, sandbox_runtime: Path | None
) -> None:
    async with server(state_dir, sandbox_runtime, MCP_SANDBOX_SHUTDOWN_GRACE="2") as live:

        async def sigterm(web: httpx2.AsyncClient) -> None:
            live.process.send_signal(signal.SIGTERM)

        sdk, plain = await with_two_long_runs(live, sigterm)
        assert_stopped(sdk, plain)
        await exited(live)


@pytest.mark.parametrize("second", [signal.SIGTERM, signal.SIGINT], ids=["sigterm", "sigint"])
async def test_a_second_signal_stops_the_runs_without_waiting_for_the_grace(
    state_dir: Path, sandbox_runtime: Path | None, second: signal.Signals
) -> None:
    grace = 120  # far beyond every bound here: only the second signal can end the drain in time
    async with server(state_dir, sandbox_runtime, MCP_SANDBOX_SHUTDOWN_GRACE=str(grace)) as live:
        sent: list[float] = []

        async def twice(web: httpx2.AsyncClient) -> None:
            live.process.send_signal(signal.SIGTERM)
            await draining(web, live)
            live.process.send_signal(second)
            sent.append(time.monotonic())

        sdk, plain = await with_two_long_runs(live, twice)
        assert_stopped(sdk, plain)
        await exited(live)
        assert time.monotonic() - sent[0] < grace


async def test_uploads_are_refused_while_the_server_drains(state_dir: Path, sandbox_runtime: Path | None) -> None:
    async with server(state_dir, sandbox_runtime, MCP_SANDBOX_SHUTDOWN_GRACE="120") as live:

        async def refused_uploads(web: httpx2.AsyncClient) -> None:
            live.process.send_signal(signal.SIGTERM)
            await draining(web, live)
            reply = await upload(live.base, ALICE, "drain-conversation", "data.txt", b"late")
            assert reply.status_code == 503 and "shutting down" in reply.json()["error"], reply.text
            async with http_client(live.base, ALICE) as client:
                arguments = {"conversationId": "drain-conversation", "filename": "b.txt", "content": "late"}
                result = await call(client, "upload_file", arguments)
            assert result.is_error
            assert "shutting down" in result.content[0].text  # type: ignore[union-attr]
            live.process.send_signal(signal.SIGTERM)  # the second: the long runs stop now

        sdk, plain = await with_two_long_runs(live, refused_uploads)
        assert_stopped(sdk, plain)
        await exited(live)
    assert not (state_dir / "workspaces").exists() or not list((state_dir / "workspaces").rglob("*.txt"))


def _catches_sigterm(pid: int) -> bool:
    """Whether process ``pid`` has a handler for SIGTERM (``SigCgt`` of its status)."""
    with open(f"/proc/{pid}/status", encoding="ascii") as status:
        caught = next(line for line in status if line.startswith("SigCgt:")).split()[1]
    return bool(int(caught, 16) & (1 << (signal.SIGTERM - 1)))


@pytest.mark.parametrize("delay", [0.0, 0.5, 1.0])
async def test_a_sigterm_during_start_up_stops_the_server_in_order(
    state_dir: Path, sandbox_runtime: Path | None, delay: float
) -> None:
    port = free_port()
    command = [sys.executable, "-m", "mcp_sandbox", "serve", "--transport", "http", "--port", str(port)]
    command += ["--state-dir", str(state_dir)]
    env = _server_env(sandbox_runtime, {"MCP_SANDBOX_DISCOVER_SERVERS": "false"})
    with tempfile.TemporaryFile() as log:
        process = await anyio.open_process(
            command, stdin=subprocess.DEVNULL, stdout=log, stderr=log, env=env, start_new_session=True
        )
        try:
            # A moment of the start-up (the imports, opening the service), counted from when the CLI
            # took the signal over: before that the interpreter itself is starting, and the
            # default action is all there is (a busy machine makes that moment seconds long).
            with anyio.fail_after(EXIT_BOUND):
                await poll(lambda: _catches_sigterm(process.pid), interval=0.01)
            await anyio.sleep(delay)
            process.send_signal(signal.SIGTERM)
            with anyio.fail_after(EXIT_BOUND):
                await process.wait()
            log.seek(0)
            assert process.returncode == 0, log.read().decode(errors="replace")[-4000:]
        finally:
            with anyio.CancelScope(shield=True):
                await _stop_server(process, 15)
