"""The earlier bridge's users over stdio: state kept without a conversationId, the helper manual.

A real ``mcp-sandbox serve`` over stdio, driven by the SDK's stdio client.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from mcp.shared.exceptions import MCPError
from mcp.types import TextResourceContents

from mcp_sandbox.runners.python.mcp_sandbox_runtime.manual import CAPABILITIES, CAPABILITIES_URI
from mcp_sandbox.server.tools.resources import RESOURCE_NOT_FOUND
from mcp_test_helpers import run_python, stdio_client, structured

pytestmark = [pytest.mark.e2e, pytest.mark.anyio]


async def test_with_stdio_conversation_variables_and_files_carry_over_without_a_conversation_id(
    state_dir: Path, sandbox_runtime: Path | None
) -> None:
    env = {"MCP_SANDBOX_STDIO_CONVERSATION": "default", "MCP_SANDBOX_DISCOVER_SERVERS": "false"}
    async with stdio_client(state_dir, sandbox_runtime, environment=env) as client:
        first = structured(await run_python(client, {"code": "x = 41\nopen('kept.txt', 'w').write('yes')"}))
        second = structured(await run_python(client, {"code": "print(x + 1, open('kept.txt').read())"}))
        other = structured(await run_python(client, {"code": "print('x' in globals())", "conversationId": "other"}))
    assert first["status"] == "success", first
    assert second["stdout"] == "42 yes\n", second
    assert [f["name"] for f in second["files"]] == ["kept.txt"]
    assert other["stdout"] == "False\n"  # a named conversation is still its own


async def test_without_stdio_conversation_each_run_starts_fresh(state_dir: Path, sandbox_runtime: Path | None) -> None:
    async with stdio_client(
        state_dir, sandbox_runtime, environment={"MCP_SANDBOX_DISCOVER_SERVERS": "false"}
    ) as client:
        await run_python(client, {"code": "x = 41"})
        second = structured(await run_python(client, {"code": "print('x' in globals())"}))
    assert second["stdout"] == "False\n"


def test_an_invalid_stdio_conversation_is_refused_at_start(state_dir: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MCP_SANDBOX_")}
    done = subprocess.run(
        [sys.executable, "-m", "mcp_sandbox", "serve", "--state-dir", str(state_dir)],
        env={**env, "MCP_SANDBOX_STDIO_CONVERSATION": "a\nb"},
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2
    assert "stdio_conversation" in done.stderr


async def test_the_helper_manual_is_listed_and_read_as_a_resource(
    state_dir: Path, sandbox_runtime: Path | None
) -> None:
    async with stdio_client(
        state_dir, sandbox_runtime, environment={"MCP_SANDBOX_DISCOVER_SERVERS": "false"}
    ) as client:
        listed = await client.list_resources()
        read = await client.read_resource(CAPABILITIES_URI)
        with pytest.raises(MCPError) as unknown:
            await client.read_resource("resource://nothing/here")
        summary = structured(
            await run_python(client, {"code": "from mcp import runtime\nprint(runtime.capability_summary(), end='')"})
        )
    # The manual, and the run view MCP Apps hosts render (tests/e2e/http/test_run_view.py).
    assert [str(resource.uri) for resource in listed.resources] == [CAPABILITIES_URI, "ui://mcp-sandbox/run"]
    (contents,) = read.contents
    assert isinstance(contents, TextResourceContents)
    assert contents.text == CAPABILITIES
    assert unknown.value.error.code == RESOURCE_NOT_FOUND
    assert summary["stdout"] == CAPABILITIES  # the same manual inside the sandbox
