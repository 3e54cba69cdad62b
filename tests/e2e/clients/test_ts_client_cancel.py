"""A run aborted by the MCP TypeScript SDK's own client ends at once, over stdio and Streamable HTTP.

ts_cancel.mjs (the SDK as `make downstream` installs it) calls a tool with an AbortSignal; once
the run's marker process is up the test tells it to abort (the SDK sends
``notifications/cancelled``). The run's processes must be gone within a bound far under its
timeout, and with one run slot the script's next call must be admitted and succeed. Python runs
take a warm sandbox, TypeScript runs a pre-started one.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest
from anyio.abc import Process
from anyio.streams.buffered import BufferedByteReceiveStream

from downstream import require_installed
from mcp_test_helpers import http_server, own_processes, poll, stdio_server_entry

from ..runs.test_cancel import GONE_BOUND, ONE_SLOT, RUN_TIMEOUT, START_BOUND, assert_gone, new_marker, sleeper

pytestmark = [pytest.mark.e2e, pytest.mark.sandbox, pytest.mark.anyio]

REPO_ROOT = Path(__file__).resolve().parents[3]
SCRIPT = Path(__file__).with_name("ts_cancel.mjs")
NODE_MODULES = REPO_ROOT / "downstream" / "node_modules"
TOKEN = "ts-cancel-token-0123456789abcdef"
SERVER_ENV = {**ONE_SLOT, "MCP_SANDBOX_PRESTART_SIZE": "1", "MCP_SANDBOX_DISCOVER_SERVERS": "false"}
LINE_BOUND = 60.0  # a line from the script: its connection and a call


def ts_sleeper(marker: str) -> str:
    return (
        'import { spawn } from "node:child_process";\n'
        f'spawn("sleep", ["{marker}"], {{ stdio: "ignore" }});\n'
        f"await new Promise((resolve) => setTimeout(resolve, {RUN_TIMEOUT * 1000}));\n"
    )


def calls(language: str, marker: str) -> dict[str, Any]:
    """The aborted call (``sleeper``) and the next one, both in ``language``."""
    if language == "python":
        call = {"name": "run_python", "arguments": {"code": sleeper(marker), "timeout": RUN_TIMEOUT}}
        following = {"name": "run_python", "arguments": {"code": "print('next')"}}
    else:
        arguments = {"code": ts_sleeper(marker), "language": language}
        call = {"name": "run_code", "arguments": arguments}
        following = {"name": "run_code", "arguments": {"code": "console.log('next')", "language": language}}
    return {"call": call, "next": following}


@asynccontextmanager
async def script(tmp_path: Path, request: dict[str, Any]) -> AsyncIterator[Process]:
    """ts_cancel.mjs running with ``request``, beside a node_modules link (as a user's client resolves the SDK)."""
    require_installed()
    node = shutil.which("node")
    assert node is not None
    work = tmp_path / "client"
    work.mkdir()
    (work / "node_modules").symlink_to(NODE_MODULES)
    copy = work / SCRIPT.name
    shutil.copyfile(SCRIPT, copy)
    # In a file: on the command line the code's marker would make the script one of the run's processes.
    (work / "request.json").write_text(json.dumps(request))
    env = {name: value for name, value in os.environ.items() if not name.startswith(("MCP_SANDBOX_", "MCP_BRIDGE_"))}
    async with await anyio.open_process([node, str(copy), str(work / "request.json")], env=env, stderr=None) as process:
        try:
            yield process
        finally:
            with anyio.CancelScope(shield=True), anyio.move_on_after(GONE_BOUND):
                await process.wait()
            if process.returncode is None:
                process.kill()


async def event(reader: BufferedByteReceiveStream) -> dict[str, Any]:
    with anyio.fail_after(LINE_BOUND):
        line = await reader.receive_until(b"\n", 1 << 20)
    parsed: dict[str, Any] = json.loads(line)
    return parsed


async def abort_and_check(process: Process, marker: str) -> None:
    """Abort once the run's marker is up; the run's processes go, and the next call runs."""
    assert process.stdout is not None and process.stdin is not None
    reader = BufferedByteReceiveStream(process.stdout)
    assert (await event(reader))["event"] == "calling"
    with anyio.fail_after(START_BOUND):
        await poll(lambda: bool(own_processes(marker)))
    await process.stdin.send(b"abort\n")
    aborted = await event(reader)
    assert aborted["event"] == "aborted" and not aborted["ok"], aborted
    await assert_gone(marker)
    following = await event(reader)
    data = following["result"]["structuredContent"]
    assert data["status"] == "success" and data["stdout"] == "next\n", data
    await process.stdin.send(b"close\n")


@pytest.mark.parametrize("language", ["python", "typescript"])
async def test_a_run_the_ts_sdk_aborts_over_stdio_ends(
    tmp_path: Path, state_dir: Path, sandbox_runtime: Path | None, language: str
) -> None:
    marker = new_marker()
    request = {"server": stdio_server_entry(state_dir, sandbox_runtime, SERVER_ENV), **calls(language, marker)}
    async with script(tmp_path, request) as process:
        await abort_and_check(process, marker)


@pytest.mark.parametrize("language", ["python", "typescript"])
async def test_a_run_the_ts_sdk_aborts_over_http_ends(
    tmp_path: Path, state_dir: Path, sandbox_runtime: Path | None, language: str
) -> None:
    env = {**SERVER_ENV, "MCP_SANDBOX_TOKEN": TOKEN}
    async with http_server(state_dir, env=env, runtime=sandbox_runtime) as base:
        marker = new_marker()
        request = {"server": {"url": f"{base}/mcp", "token": TOKEN}, **calls(language, marker)}
        async with script(tmp_path, request) as process:
            await abort_and_check(process, marker)
