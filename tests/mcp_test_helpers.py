"""Helpers shared by the suites that drive the MCP tools (in memory and over real stdio)."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import anyio
from mcp import Client
from mcp.types import CallToolResult, TextContent

CALL_BOUND = 60.0


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
