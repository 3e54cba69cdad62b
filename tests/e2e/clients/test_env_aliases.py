"""The earlier systems' environment variables, honoured by a real ``serve --transport http``.

The code runner's ``.env`` (``MCP_API_TOKEN``, ``PUBLIC_BASE_URL``, ``MCP_HTTP_ADDR``) and the
bridge's ``MCP_BRIDGE_LOG_LEVEL`` are given to the server exactly as their users set them; no
``--host``/``--port`` flag and no ``MCP_SANDBOX_*`` variable says the same.
"""

from __future__ import annotations

import base64
import uuid
from pathlib import Path
from typing import Any

import httpx2
import pytest

from mcp_test_helpers import CALL_BOUND, http_server

pytestmark = [pytest.mark.e2e, pytest.mark.anyio]

TOKEN = "runner-token-0123456789abcdef"
PUBLIC = "https://sandbox.example.org/runner"


def tools_call(name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": name, "arguments": arguments}}


async def test_the_earlier_runners_and_bridges_variables_configure_a_real_server(
    state_dir: Path, sandbox_runtime: Path | None, tmp_path: Path
) -> None:
    log = tmp_path / "server.log"
    env = {"MCP_API_TOKEN": TOKEN, "PUBLIC_BASE_URL": PUBLIC, "MCP_BRIDGE_LOG_LEVEL": "DEBUG"}
    # MCP_HTTP_ADDR is the only place the address is given: the server listens where it says.
    async with (
        http_server(state_dir, env=env, runtime=sandbox_runtime, address_env="MCP_HTTP_ADDR", log_path=log) as base,
        httpx2.AsyncClient(timeout=CALL_BOUND) as web,
    ):
        body = tools_call(
            "upload_file",
            {
                "conversationId": f"c-{uuid.uuid4().hex}",
                "filename": "a.txt",
                "content": base64.b64encode(b"hi").decode(),
            },
        )
        # MCP_API_TOKEN: the server requires it...
        refused = await web.post(f"{base}/mcp", json=body)
        wrong = await web.post(f"{base}/mcp", json=body, headers={"Authorization": "Bearer not-the-token-0123456789"})
        # ...and accepts it.
        accepted = await web.post(f"{base}/mcp", json=body, headers={"Authorization": f"Bearer {TOKEN}"})
    assert refused.status_code == 401
    assert wrong.status_code == 401
    assert accepted.status_code == 200, accepted.text
    result = accepted.json()["result"]
    assert not result["isError"], result
    # PUBLIC_BASE_URL: file links are made on it.
    assert result["structuredContent"]["url"].startswith(f"{PUBLIC}/files/")
    # MCP_BRIDGE_LOG_LEVEL: the server logs at DEBUG (its default is WARNING).
    assert any(line.startswith("DEBUG ") for line in log.read_text(errors="replace").splitlines())
