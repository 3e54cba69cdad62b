"""A long run as a task through FastMCP 4's own client (fastmcp-tasks), whose request timeout is shorter than the run.

FastMCP's client speaks the 2026-07-28 tasks extension (``io.modelcontextprotocol/tasks``) when
``fastmcp-tasks`` is imported. It lives in a venv of its own (``make downstream``:
.downstream/fastmcp, never the project's venv) and runs fastmcp_task_call.py against a real
``serve --transport http`` with a token and ``task_after`` 1 s: ``call_tool_task``'s handle sees
the task working, then completed with the run's output, though the run outlasts the client's
request timeout; a plain ``call_tool`` gets the same result, the task polled under the hood; the
first task is then asked for over plain JSON-RPC.
"""

from __future__ import annotations

import json
import subprocess
import uuid
from pathlib import Path
from typing import Any

import anyio
import httpx2
import pytest

from mcp_test_helpers import CALL_BOUND, auth_tokens, http_server

from .venvs import downstream_python

pytestmark = [pytest.mark.e2e, pytest.mark.anyio]

TOKEN = "fastmcp-token-0123456789abcdef"
SCRIPT = Path(__file__).with_name("fastmcp_task_call.py")
REQUEST_TIMEOUT = 2  # seconds: the client's, shorter than the run
MODERN = "2026-07-28"


def fastmcp_python() -> Path:
    return downstream_python("fastmcp", "MCP_SANDBOX_TEST_FASTMCP_PYTHON", "FastMCP")


async def test_a_run_longer_than_the_clients_request_timeout_completes_as_a_task(
    state_dir: Path, sandbox_runtime: Path | None
) -> None:
    python = fastmcp_python()
    config = state_dir.parent / f"fastmcp-{uuid.uuid4().hex[:8]}.toml"
    config.write_text(auth_tokens({"default": TOKEN}))
    code = f"import time; time.sleep({REQUEST_TIMEOUT + 1}); print('outlived the timeout')"
    env = {"MCP_SANDBOX_TASK_AFTER": "1"}
    with anyio.fail_after(CALL_BOUND * 2):
        async with http_server(state_dir, "--config", str(config), env=env, runtime=sandbox_runtime) as url:
            request = {"url": f"{url}/mcp", "token": TOKEN, "code": code, "timeout": REQUEST_TIMEOUT}
            done = await anyio.run_process(
                [str(python), "-W", "ignore::DeprecationWarning", str(SCRIPT), json.dumps(request)],
                check=False,
                stderr=subprocess.PIPE,
            )
            assert done.returncode == 0, done.stderr.decode(errors="replace")
            ran = json.loads(done.stdout)
            asked = await _get(url, ran["taskId"])

    assert ran["protocol"] == MODERN
    assert ran["seen"][:2] == ["working", "working"] and ran["seen"][-1] == "completed"
    assert ran["handled"]["stdout"] == "outlived the timeout\n"  # past the request timeout: polled as a task
    assert ran["plain"]["stdout"] == "outlived the timeout\n"
    assert asked["status"] == "completed"  # the same task, asked again over plain JSON-RPC
    assert asked["result"]["structuredContent"]["stdout"] == "outlived the timeout\n"


async def _get(url: str, task_id: str) -> dict[str, Any]:
    """``tasks/get`` of ``task_id`` in the extension's era, as curl would send it."""
    meta = {
        "io.modelcontextprotocol/protocolVersion": MODERN,
        "io.modelcontextprotocol/clientInfo": {"name": "test", "version": "1"},
        "io.modelcontextprotocol/clientCapabilities": {"extensions": {"io.modelcontextprotocol/tasks": {}}},
    }
    headers = {
        "Authorization": f"Bearer {TOKEN}",
        "MCP-Protocol-Version": MODERN,
        "Mcp-Method": "tasks/get",
        "Mcp-Name": task_id,
    }
    body = {"jsonrpc": "2.0", "id": 1, "method": "tasks/get", "params": {"taskId": task_id, "_meta": meta}}
    async with httpx2.AsyncClient(timeout=CALL_BOUND) as web:
        reply = await web.post(f"{url}/mcp", json=body, headers=headers)
    answer: dict[str, Any] = reply.json()["result"]
    return answer
