"""The official MCP Inspector CLI against a real `mcp-sandbox serve --transport http`.

`@modelcontextprotocol/inspector --cli` (pinned in conformance/package-lock.json, installed by
`make conformance-tools`) is a client we did not write: it lists and calls our tools over
Streamable HTTP (handshake era and the stateless 2026-07-28 revision) and over legacy SSE, on a
server without auth and on one that requires a bearer token. Every call is a fresh CLI process,
so a conversation's files outlive the MCP session that wrote them.
"""

from __future__ import annotations

import base64
import json
import os
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import httpx2
import pytest

from mcp_test_helpers import INSPECTOR_JS, conformance_node, http_server

pytestmark = [pytest.mark.e2e, pytest.mark.anyio]

TOKEN = "inspector-e2e-token-6f1d2a9c"
OUR_TOOLS = {"run_python", "run_code", "upload_file", "list_runners"}
# One CLI run: start node, connect, one request (a sandbox run at most).
CLI_BOUND = 90.0
# The Inspector's exit code for a 401/403 (EXIT_CODES.AUTH_REQUIRED in its CLI).
EXIT_AUTH_REQUIRED = 3


@dataclass(frozen=True)
class Way:
    """How the Inspector reaches the server: transport, endpoint and protocol era."""

    transport: str
    path: str
    era: str

    @property
    def id(self) -> str:
        return f"{self.transport}-{self.era}"


WAYS = (
    Way("http", "/mcp", "legacy"),  # initialize handshake, sessions (2025-11-25)
    Way("http", "/mcp", "modern"),  # stateless, server/discover (2026-07-28)
    Way("sse", "/sse", "legacy"),  # the deprecated HTTP+SSE transport
)


@dataclass(frozen=True)
class Outcome:
    returncode: int
    result: Any  # the JSON-RPC result (stdout), when the call succeeded
    error: dict[str, Any] | None  # the CLI's error envelope (stderr), when it failed
    stderr: str


@pytest.fixture(scope="module")
def node() -> Path:
    return conformance_node()


@pytest.fixture(scope="module")
async def open_url(node: Path, module_state_dir: Path, sandbox_runtime: Path | None) -> AsyncIterator[str]:
    async with http_server(module_state_dir.parent / "open", runtime=sandbox_runtime) as url:
        yield url


@pytest.fixture(scope="module")
async def guarded_url(node: Path, module_state_dir: Path, sandbox_runtime: Path | None) -> AsyncIterator[str]:
    env = {"MCP_SANDBOX_TOKEN": TOKEN}
    async with http_server(module_state_dir.parent / "guarded", env=env, runtime=sandbox_runtime) as url:
        yield url


@pytest.fixture(params=WAYS, ids=[way.id for way in WAYS])
def way(request: pytest.FixtureRequest) -> Way:
    way: Way = request.param
    return way


@pytest.fixture(params=["no-auth", "bearer"])
def server(request: pytest.FixtureRequest) -> tuple[str, str | None]:
    """The base URL of a server and the token to send it: one without auth, one that requires it."""
    if request.param == "bearer":
        url: str = request.getfixturevalue("guarded_url")
        return url, TOKEN
    return request.getfixturevalue("open_url"), None


async def inspect(node: Path, home: Path, url: str, way: Way, *args: str, token: str | None = None) -> Outcome:
    """One `inspector --cli` run against ``url`` the ``way`` given, JSON in and out, bounded."""
    command = [
        str(node),
        str(INSPECTOR_JS),
        "--cli",
        "--server-url",
        url + way.path,
        "--transport",
        way.transport,
        "--protocol-era",
        way.era,
        "--format",
        "json",
        # Never an interactive OAuth login on a 401: fail with auth_required instead.
        "--stored-auth-only",
        *args,
    ]
    if token is not None:
        command += ["--header", f"Authorization: Bearer {token}"]
    # Its catalog, client config and OAuth store live under HOME: a throwaway one, not ours.
    env = {"HOME": str(home), "PATH": os.environ.get("PATH", os.defpath)}
    with anyio.fail_after(CLI_BOUND):
        run = await anyio.run_process(command, check=False, env=env, cwd=home)
    stdout, stderr = run.stdout.decode(), run.stderr.decode(errors="replace")
    if run.returncode == 0:
        return Outcome(run.returncode, json.loads(stdout)["result"], None, stderr)
    # On failure the last line of stderr is the CLI's envelope: {"error": {"code", "message", ...}}.
    lines = stderr.strip().splitlines()
    try:
        error: dict[str, Any] | None = json.loads(lines[-1])["error"] if lines else None
    except (ValueError, KeyError, TypeError):
        error = None
    return Outcome(run.returncode, None, error, stderr)


async def call(
    node: Path, home: Path, url: str, way: Way, tool: str, arguments: dict[str, Any], token: str | None
) -> dict[str, Any]:
    """Call ``tool`` and return its structuredContent, asserting the call succeeded."""
    outcome = await inspect(
        node,
        home,
        url,
        way,
        "--method",
        "tools/call",
        "--tool-name",
        tool,
        "--tool-args-json",
        json.dumps(arguments),
        token=token,
    )
    assert outcome.returncode == 0, outcome.stderr
    assert outcome.result["isError"] is False, outcome.result
    structured: dict[str, Any] = outcome.result["structuredContent"]
    return structured


async def first_request_by_hand(url: str, way: Way, token: str | None, arguments: dict[str, Any]) -> tuple[int, str]:
    """The HTTP status and WWW-Authenticate of the request a client sends first, sent with httpx2."""
    headers = {} if token is None else {"Authorization": f"Bearer {token}"}
    body: dict[str, Any] | None = None
    method = "GET"
    headers["Accept"] = "text/event-stream"
    if way.transport == "http":
        method = "POST"
        headers["Accept"] = "application/json, text/event-stream"
        body = {
            "jsonrpc": "2.0",
            "id": 1,
            "method": "tools/call",
            "params": {"name": "run_python", "arguments": arguments},
        }
    # Streamed, and closed unread: an SSE stream that wrongly opened would never end.
    with anyio.fail_after(CLI_BOUND):
        async with (
            httpx2.AsyncClient() as http,
            http.stream(method, url + way.path, headers=headers, json=body) as response,
        ):
            return response.status_code, response.headers.get("WWW-Authenticate", "")


async def test_the_inspector_lists_our_tools(
    node: Path, server: tuple[str, str | None], way: Way, tmp_path: Path
) -> None:
    url, token = server
    outcome = await inspect(node, tmp_path, url, way, "--method", "tools/list", token=token)
    assert outcome.returncode == 0, outcome.stderr
    names = {tool["name"] for tool in outcome.result["tools"]}
    assert names >= OUR_TOOLS


async def test_run_python_called_by_the_inspector_prints_42(
    node: Path, server: tuple[str, str | None], way: Way, tmp_path: Path
) -> None:
    url, token = server
    data = await call(node, tmp_path, url, way, "run_python", {"code": "print(6*7)"}, token)
    assert data["status"] == "success"
    assert data["stdout"] == "42\n"


@pytest.mark.parametrize("token", [None, "wrong-token-of-sufficient-length"], ids=["without-token", "wrong-token"])
async def test_a_call_without_the_right_token_is_refused_with_401(
    node: Path, guarded_url: str, way: Way, token: str | None, tmp_path: Path
) -> None:
    arguments = {"code": "print(6*7)"}
    outcome = await inspect(
        node,
        tmp_path,
        guarded_url,
        way,
        "--method",
        "tools/call",
        "--tool-name",
        "run_python",
        "--tool-args-json",
        json.dumps(arguments),
        token=token,
    )
    # The Inspector says auth_required (exit 3) for a 401 or a 403, without the status: the
    # same first request, sent by hand, shows which.
    assert outcome.returncode == EXIT_AUTH_REQUIRED, outcome.stderr
    assert outcome.error is not None
    assert outcome.error["code"] == "auth_required"
    status, challenge = await first_request_by_hand(guarded_url, way, token, arguments)
    assert status == 401
    assert challenge.startswith("Bearer ")


async def test_a_file_uploaded_in_one_session_is_read_by_run_python_in_the_next(
    node: Path, server: tuple[str, str | None], way: Way, tmp_path: Path
) -> None:
    url, token = server
    conversation = f"inspector-{way.id}-{'bearer' if token else 'open'}"
    payload = b"line one\nline two\n"
    upload = {"conversationId": conversation, "filename": "notes.txt", "content": base64.b64encode(payload).decode()}
    await call(node, tmp_path, url, way, "upload_file", upload, token)
    code = "import pathlib; print(pathlib.Path('/workspace/notes.txt').read_text().splitlines()[-1])"
    data = await call(node, tmp_path, url, way, "run_python", {"code": code, "conversationId": conversation}, token)
    assert data["status"] == "success"
    assert data["stdout"] == "line two\n"
