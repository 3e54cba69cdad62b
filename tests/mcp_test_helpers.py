"""Helpers shared by the suites that drive the MCP tools (in memory and over real stdio)."""

from __future__ import annotations

import importlib.util
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
from mcp import Client, StdioServerParameters
from mcp.types import CallToolResult, TextContent

CALL_BOUND = 60.0


def _child_pythonpath() -> str | None:
    """The PYTHONPATH the server process needs to import the package this test imported.

    The stdio client passes the child only HOME, PATH and a few more variables, so a PYTHONPATH
    that makes the package importable here is not inherited; an installed package needs none.
    """
    spec = importlib.util.find_spec("mcp_sandbox")
    assert spec is not None and spec.origin is not None
    source_root = Path(spec.origin).resolve().parents[1]
    on_pythonpath = {Path(p).resolve() for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p}
    return str(source_root) if source_root in on_pythonpath else None


def stdio_client(state_dir: Path, runtime: Path | None, *extra_args: str) -> Client:
    """A client of a real `mcp-sandbox serve` over stdio, started with ``extra_args``."""
    env: dict[str, str] = {}
    if (pythonpath := _child_pythonpath()) is not None:
        env["PYTHONPATH"] = pythonpath
    if runtime is not None:
        env["MCP_SANDBOX_PYTHON_RUNTIME"] = str(runtime)
    params = StdioServerParameters(
        command=sys.executable,
        args=["-m", "mcp_sandbox", "serve", "--state-dir", str(state_dir), *extra_args],
        env=env,
    )
    # read_timeout_seconds bounds every request, the connection handshake included.
    return Client(params, read_timeout_seconds=CALL_BOUND)


async def run_python(client: Client, arguments: dict[str, Any] | None, bound: float = CALL_BOUND) -> CallToolResult:
    """Call ``run_python``, bounded."""
    with anyio.fail_after(bound):
        return await client.call_tool("run_python", arguments)


def structured(result: CallToolResult) -> dict[str, Any]:
    data: dict[str, Any] | None = result.structured_content
    assert data is not None
    return data


def text(result: CallToolResult) -> str:
    assert len(result.content) == 1
    block = result.content[0]
    assert isinstance(block, TextContent)
    return block.text


def host_processes(marker: str) -> list[int]:
    """Host pids (other than ours) whose command line or name contains ``marker``."""
    found: list[int] = []
    needle = marker.encode()
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as cmdline, open(f"/proc/{entry}/comm", "rb") as comm:
                if needle in cmdline.read() or needle in comm.read():
                    found.append(int(entry))
        except OSError:  # exited while we looked
            continue
    return found


async def poll(condition: Callable[[], bool], interval: float = 0.05) -> None:
    """Poll ``condition`` until it holds; the caller bounds the wait (anyio.fail_after)."""
    while not condition():  # noqa: ASYNC110 - /proc has no event to wait on
        await anyio.sleep(interval)
