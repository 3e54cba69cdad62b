# ruff: noqa: E501  (the README payloads are kept verbatim)
"""Plain JSON-RPC over HTTP, as the earlier code runner's users (curl, n8n, scripts) spoke it.

Its README's curl calls are replayed literally with the real ``curl`` against a real
``serve --transport http``: no ``Accept`` header beyond curl's ``*/*``, no session, ``initialize``
without ``capabilities``. They must get plain ``application/json`` replies. MCP clients that accept
an event stream keep their sessions and SSE. Static tokens advertise no OAuth authorization server.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import pytest

from mcp_test_helpers import CALL_BOUND, http_server

pytestmark = [pytest.mark.e2e, pytest.mark.anyio]

TOKEN = "your-token-0123456789abcdef"  # the README's "your-token", long enough for our minimum
BOTH = "application/json, text/event-stream"


@pytest.fixture(scope="module")
async def base(module_state_dir: Path, sandbox_runtime: Path | None) -> AsyncIterator[str]:
    async with http_server(module_state_dir, env={"MCP_SANDBOX_TOKEN": TOKEN}, runtime=sandbox_runtime) as url:
        yield url


class Reply:
    """An HTTP reply as ``curl -i`` printed it."""

    def __init__(self, raw: bytes) -> None:
        head, _, self.body = raw.partition(b"\r\n\r\n")
        status_line, *lines = head.decode("latin-1").split("\r\n")
        self.status = int(status_line.split()[1])
        self.headers = {name.lower(): value.strip() for name, _, value in (line.partition(":") for line in lines)}

    def json(self) -> Any:
        return json.loads(self.body)


async def curl(*args: str) -> Reply:
    with anyio.fail_after(CALL_BOUND * 2):
        done = await anyio.run_process(["curl", "-sS", "-i", *args], check=True)
    return Reply(done.stdout)


async def readme_call(base: str, payload: str) -> Reply:
    """One of the README's calls: ``curl -X POST …/mcp -H Authorization -H Content-Type -d '…'``."""
    return await curl(
        "-X",
        "POST",
        f"{base}/mcp",
        "-H",
        f"Authorization: Bearer {TOKEN}",
        "-H",
        "Content-Type: application/json",
        "-d",
        payload,
    )


def result_of(reply: Reply, request_id: int) -> dict[str, Any]:
    """The JSON-RPC result of a plain-JSON reply (which must carry no session id)."""
    assert reply.status == 200, reply.body
    assert reply.headers["content-type"].startswith("application/json")
    assert "mcp-session-id" not in reply.headers
    message = reply.json()
    assert message["id"] == request_id
    assert "error" not in message, message
    result: dict[str, Any] = message["result"]
    return result


# The payloads exactly as the earlier runner's README wrote them.
INITIALIZE = """{
  "jsonrpc": "2.0",
  "id": 1,
  "method": "initialize",
  "params": {
    "protocolVersion": "2024-11-05",
    "clientInfo": {"name": "client", "version": "1.0"}
  }
}"""
TOOLS_LIST = """{
  "jsonrpc": "2.0",
  "id": 2,
  "method": "tools/list"
}"""
UPLOAD_FILE = """{
    "jsonrpc": "2.0",
    "id": 1,
    "method": "tools/call",
    "params": {
      "name": "upload_file",
      "arguments": {
        "conversationId": "session-123",
        "filename": "data.csv",
        "content": "bmFtZSxhZ2UKQWxpY2UsMzAKQm9iLDI1"
      }
    }
  }"""
RUN_CODE = """{
    "jsonrpc": "2.0",
    "id": 2,
    "method": "tools/call",
    "params": {
      "name": "run_code",
      "arguments": {
        "conversationId": "session-123",
        "language": "python",
        "code": "import pandas as pd\\nimport matplotlib.pyplot as plt\\n\\ndf = pd.read_csv(\\"/data/data.csv\\")\\nprint(df.describe())\\n\\nplt.bar(df[\\"name\\"], df[\\"age\\"])\\nplt.savefig(\\"/data/chart.png\\")\\nprint(\\"Chart saved!\\")"
      }
    }
  }"""
LIST_RUNNERS = """{
    "jsonrpc": "2.0",
    "id": 4,
    "method": "tools/call",
    "params": {
      "name": "list_runners"
    }
  }"""


async def test_the_earlier_runners_readme_calls_work_unchanged_and_get_plain_json(base: str) -> None:
    initialized = result_of(await readme_call(base, INITIALIZE), 1)
    assert initialized["serverInfo"]["name"] == "mcp-sandbox"
    assert initialized["protocolVersion"] == "2024-11-05"

    tools = {tool["name"] for tool in result_of(await readme_call(base, TOOLS_LIST), 2)["tools"]}
    assert {"upload_file", "run_code", "list_runners"} <= tools

    uploaded = result_of(await readme_call(base, UPLOAD_FILE), 1)
    assert not uploaded["isError"], uploaded
    assert uploaded["structuredContent"]["size"] == len(b"name,age\nAlice,30\nBob,25")

    ran = result_of(await readme_call(base, RUN_CODE), 2)
    assert not ran["isError"], ran
    assert "Chart saved!" in ran["structuredContent"]["stdout"]
    assert "mean" in ran["structuredContent"]["stdout"]
    files = {f["name"]: f["url"] for f in ran["structuredContent"]["files"]}
    assert {"data.csv", "chart.png"} <= set(files)
    chart = await curl(files["chart.png"])  # the link needs no token
    assert chart.status == 200
    assert chart.body.startswith(b"\x89PNG")

    runners = result_of(await readme_call(base, LIST_RUNNERS), 4)
    assert {"python", "typescript"} <= {r["language"] for r in runners["structuredContent"]["runners"]}


async def test_accept_application_json_alone_is_answered_with_json_not_406(base: str) -> None:
    reply = await curl(
        "-X",
        "POST",
        f"{base}/mcp",
        "-H",
        f"Authorization: Bearer {TOKEN}",
        "-H",
        "Content-Type: application/json",
        "-H",
        "Accept: application/json",
        "-d",
        json.dumps(
            {
                "jsonrpc": "2.0",
                "id": 7,
                "method": "tools/call",
                "params": {"name": "run_python", "arguments": {"code": "print(6 * 7)"}},
            }
        ),
    )
    assert result_of(reply, 7)["structuredContent"]["stdout"] == "42\n"


async def test_initialize_without_client_info_is_refused_naming_the_field(base: str) -> None:
    body = {"jsonrpc": "2.0", "id": 3, "method": "initialize", "params": {"protocolVersion": "2024-11-05"}}
    reply = await readme_call(base, json.dumps(body))
    assert reply.status == 400
    assert "mcp-session-id" not in reply.headers
    error = reply.json()["error"]
    assert error["code"] == -32602
    assert "clientInfo" in error["message"]
    assert "capabilities" not in error["message"]  # that one is filled in


async def test_a_client_that_accepts_event_streams_keeps_sessions_and_sse(base: str) -> None:
    auth = ["-H", f"Authorization: Bearer {TOKEN}", "-H", "Content-Type: application/json", "-H", f"Accept: {BOTH}"]
    initialize = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "initialize",
        "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "c", "version": "1"}},
    }
    opened = await curl("-X", "POST", f"{base}/mcp", *auth, "-d", json.dumps(initialize))
    assert opened.status == 200
    assert opened.headers["content-type"].startswith("text/event-stream")
    session = opened.headers["mcp-session-id"]
    listed = await curl(
        "-X",
        "POST",
        f"{base}/mcp",
        *auth,
        "-H",
        f"Mcp-Session-Id: {session}",
        "-H",
        "MCP-Protocol-Version: 2025-06-18",
        "-d",
        json.dumps({"jsonrpc": "2.0", "id": 2, "method": "tools/list"}),
    )
    assert listed.status == 200
    assert listed.headers["content-type"].startswith("text/event-stream")
    assert b'"run_python"' in listed.body

    # Without a session, a tools/call from such a client is served statelessly, still as a stream.
    call = {"jsonrpc": "2.0", "id": 3, "method": "tools/call", "params": {"name": "list_runners", "arguments": {}}}
    stateless = await curl("-X", "POST", f"{base}/mcp", *auth, "-d", json.dumps(call))
    assert stateless.status == 200
    assert stateless.headers["content-type"].startswith("text/event-stream")
    assert "mcp-session-id" not in stateless.headers
    assert b'"runners"' in stateless.body


@pytest.mark.parametrize(
    ("method", "accept", "body"),
    [
        ("POST", "*/*", "{not json"),
        ("POST", BOTH, "{not json"),
        ("GET", BOTH, ""),  # a Streamable HTTP client's; `text/event-stream` alone opens the HTTP+SSE transport
        ("DELETE", BOTH, ""),
    ],
)
async def test_error_replies_to_requests_without_a_session_carry_no_session_id(
    base: str, method: str, accept: str, body: str
) -> None:
    args = ["-X", method, f"{base}/mcp", "-H", f"Authorization: Bearer {TOKEN}", "-H", f"Accept: {accept}"]
    if body:
        args += ["-H", "Content-Type: application/json", "-d", body]
    reply = await curl(*args)
    assert reply.status >= 400
    assert "mcp-session-id" not in reply.headers


async def test_an_unknown_session_is_still_404(base: str) -> None:
    reply = await readme_call(base, TOOLS_LIST.replace('"id": 2', '"id": 5'))
    assert reply.status == 200
    stale = await curl(
        "-X",
        "POST",
        f"{base}/mcp",
        "-H",
        f"Authorization: Bearer {TOKEN}",
        "-H",
        "Content-Type: application/json",
        "-H",
        f"Mcp-Session-Id: {uuid.uuid4().hex}",
        "-d",
        TOOLS_LIST,
    )
    assert stale.status == 404


# --- OAuth discovery: static tokens advertise no authorization server ------------------------


@pytest.mark.parametrize(
    "path",
    [
        "/.well-known/oauth-protected-resource/mcp",
        "/.well-known/oauth-protected-resource",
        "/.well-known/oauth-authorization-server",
        "/.well-known/openid-configuration",
    ],
)
async def test_oauth_discovery_finds_no_authorization_server_and_says_a_bearer_token_is_required(
    base: str, path: str
) -> None:
    reply = await curl(f"{base}{path}")
    assert reply.status == 404
    error = reply.json()
    assert error["error"] == "invalid_request"
    assert "bearer token required" in error["error_description"]


async def test_dynamic_client_registration_is_refused_with_a_json_error(base: str) -> None:
    reply = await curl(
        "-X", "POST", f"{base}/register", "-H", "Content-Type: application/json", "-d", '{"redirect_uris": []}'
    )
    assert reply.status == 404
    assert "bearer token required" in reply.json()["error_description"]


async def test_a_request_without_a_token_gets_a_bearer_challenge_without_resource_metadata(base: str) -> None:
    reply = await curl("-X", "POST", f"{base}/mcp", "-H", "Content-Type: application/json", "-d", TOOLS_LIST)
    assert reply.status == 401
    challenge = reply.headers["www-authenticate"]
    assert challenge.startswith("Bearer ")
    assert 'error_description="bearer token required"' in challenge
    assert "resource_metadata" not in challenge
