"""Run views with replicas, for real: two server processes on loopback sharing PostgreSQL, their hop mutual TLS.

A run forwarded through B to the conversation's owner A links a view A holds: read through B,
B asks A. A task started on A is stopped through B (B asks A); a task started through B and
forwarded to A links a view B holds: stopped through A (A asks B, which cancels its hop, and A
kills the run). Each Stop ends the run's processes. Another tenant's ids read and stop exactly as
ids never made, on both replicas, even once the holder is gone; the holder killed, its views read
as a clear error at once (in the 2026-07-28 revision's raw JSON-RPC).
"""

from __future__ import annotations

import json
import secrets
import textwrap
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import httpx2
import pytest

from mcp_sandbox.server.tools.run_views import STOPPED_FROM_VIEW
from mcp_test_helpers import CALL_BOUND, auth_tokens, host_processes, new_conversation, poll
from postgres_helpers import Cluster
from replica_helpers import TOKEN, InternalHop, lease_rows, long_run, replicas_apart
from tls_helpers import certificates

pytestmark = [pytest.mark.e2e, pytest.mark.anyio, pytest.mark.slow]

MODERN = "2026-07-28"
OTHER = "other-tenant-token-0123456789abcdef"
NOT_FOUND = -32002


async def rpc(url: str, token: str, method: str, params: dict[str, Any], *, tasks: bool = False) -> dict[str, Any]:
    """One request of the 2026-07-28 revision (a client that declares the tasks extension with ``tasks``)."""
    capabilities: dict[str, Any] = {"extensions": {"io.modelcontextprotocol/tasks": {}}} if tasks else {}
    meta = {
        "io.modelcontextprotocol/protocolVersion": MODERN,
        "io.modelcontextprotocol/clientInfo": {"name": "t", "version": "1"},
        "io.modelcontextprotocol/clientCapabilities": capabilities,
    }
    framed = {**params, "_meta": {**params.get("_meta", {}), **meta}}
    body = {"jsonrpc": "2.0", "id": 1, "method": method, "params": framed}
    name = params.get("name") if method == "tools/call" else params.get("uri")
    headers = {
        "Authorization": f"Bearer {token}",
        "MCP-Protocol-Version": MODERN,
        "Mcp-Method": method,
        "Accept": "application/json, text/event-stream",
        **({"Mcp-Name": name} if isinstance(name, str) else {}),
    }
    async with httpx2.AsyncClient(timeout=CALL_BOUND) as web:
        reply = await web.post(f"{url}/mcp", json=body, headers=headers)
    message: dict[str, Any] = reply.json()
    assert "result" in message or "error" in message, reply.text
    return message


def run(code: str, conversation: str) -> dict[str, Any]:
    return {"name": "run_python", "arguments": {"code": textwrap.dedent(code), "conversationId": conversation}}


def stop(view_id: str) -> dict[str, Any]:
    return {"name": "run_python", "arguments": {}, "_meta": {"mcp-sandbox/stop": view_id}}


def linked(answer: dict[str, Any]) -> str:
    """The run view's URI a result or task links."""
    uri: str = answer["result"]["_meta"]["ui"]["resourceUri"]
    return uri


def state(message: dict[str, Any]) -> dict[str, Any]:
    assert "result" in message, message
    read: dict[str, Any] = json.loads(message["result"]["contents"][0]["text"])
    return read


def unknown(view_id: str, uri: str) -> dict[str, Any]:
    """The error an id the caller's tenant has not reads as, on one server."""
    return {"code": NOT_FOUND, "message": f"unknown run {view_id!r} ({uri})"}


async def until_state(url: str, uri: str, holds: Callable[[dict[str, Any]], bool]) -> dict[str, Any]:
    """The view's state read through ``url`` until ``holds(state)`` (the caller bounds the wait)."""
    while True:
        seen = state(await rpc(url, TOKEN, "resources/read", {"uri": f"{uri}/state"}))
        if holds(seen):
            return seen
        await anyio.sleep(0.1)


async def test_a_run_view_is_read_and_stopped_through_either_replica_and_only_by_its_tenant(
    postgres: Cluster, sandbox_runtime: Path | None, tmp_path: Path
) -> None:
    ca, identities = certificates(tmp_path / "replicas", "replicas-test-ca", 2)
    config = tmp_path / "tenants.toml"
    config.write_text(auth_tokens({"other": OTHER}))
    env = {"MCP_SANDBOX_CONFIG": str(config), "MCP_SANDBOX_TASK_AFTER": "0"}
    url = postgres.create_database()
    async with replicas_apart(2, url, sandbox_runtime, InternalHop(ca, identities), **env) as (a, b):
        conversation = new_conversation()
        on_a, through_b = f"on-a-{uuid.uuid4().hex}", f"through-b-{uuid.uuid4().hex}"
        with anyio.fail_after(CALL_BOUND * 3):
            await rpc(a.url, TOKEN, "tools/call", run("x = 41", conversation))  # A holds the conversation
            forwarded = await rpc(b.url, TOKEN, "tools/call", run("print('seen', x + 1)", conversation))
            uri = linked(forwarded)
            view_id = uri.rsplit("/", 1)[1]
            page = await rpc(b.url, TOKEN, "resources/read", {"uri": uri})
            read = state(await rpc(b.url, TOKEN, "resources/read", {"uri": f"{uri}/state"}))
            owner = {row[1] for row in lease_rows(url)}
            strangers = [await rpc(r.url, OTHER, "resources/read", {"uri": f"{uri}/state"}) for r in (a, b)]
            never = secrets.token_urlsafe(len(view_id) * 3 // 4)
            never_uri = f"ui://mcp-sandbox/run/{never}"
            nevers = [await rpc(r.url, OTHER, "resources/read", {"uri": never_uri}) for r in (a, b)]

            # A task on A, its view A's: the other tenant's Stop through B is refused, the owner's ends it.
            started = await rpc(a.url, TOKEN, "tools/call", run(long_run(on_a), conversation), tasks=True)
            held_by_a = linked(started)
            await until_state(b.url, held_by_a, lambda seen: "tick 1" in seen.get("lines", []))
            foreign_stop = await rpc(b.url, OTHER, "tools/call", stop(held_by_a.rsplit("/", 1)[1]))
            still_running = bool(host_processes(on_a))
            stopped = await rpc(b.url, TOKEN, "tools/call", stop(held_by_a.rsplit("/", 1)[1]))
            await poll(lambda: not host_processes(on_a))
            ended_a = await until_state(b.url, held_by_a, lambda seen: seen["status"] == "ended")

            # A task through B, forwarded to A: its view is B's, stopped through A.
            started = await rpc(b.url, TOKEN, "tools/call", run(long_run(through_b), conversation), tasks=True)
            held_by_b = linked(started)
            await poll(lambda: bool(host_processes(through_b)))
            running_b = state(await rpc(a.url, TOKEN, "resources/read", {"uri": f"{held_by_b}/state"}))
            stopped_b = await rpc(a.url, TOKEN, "tools/call", stop(held_by_b.rsplit("/", 1)[1]))
            await poll(lambda: not host_processes(through_b))
            ended_b = await until_state(a.url, held_by_b, lambda seen: seen["status"] == "ended")

            killed = time.monotonic()
            await b.kill()
            gone = await rpc(a.url, TOKEN, "resources/read", {"uri": f"{held_by_b}/state"})
            gone_stop = await rpc(a.url, TOKEN, "tools/call", stop(held_by_b.rsplit("/", 1)[1]))
            answered_in = time.monotonic() - killed
            stranger_after = await rpc(a.url, OTHER, "resources/read", {"uri": f"{held_by_b}/state"})

    assert owner == {a.replica_url}  # the run through B ran on A, which holds the view
    assert page["result"]["contents"][0]["mimeType"] == "text/html;profile=mcp-app"
    assert read["status"] == "ended" and read["result"]["structuredContent"]["stdout"] == "seen 42\n", read
    assert a.replica_url not in uri and "127.0.0.1" not in uri  # the holder is sealed in the id, not shown
    for stranger in strangers:  # word for word what an id never made reads as
        assert stranger["error"] == unknown(view_id, f"{uri}/state"), stranger
    for refused in nevers:
        assert refused["error"] == unknown(never, never_uri), refused

    assert foreign_stop["result"]["isError"] and still_running, foreign_stop
    assert foreign_stop["result"]["content"][0]["text"] == f"unknown run {held_by_a.rsplit('/', 1)[1]!r}"
    assert stopped["result"]["content"][0]["text"] == "stopping the run", stopped
    assert ended_a["result"]["structuredContent"]["error"] == STOPPED_FROM_VIEW, ended_a

    assert running_b["status"] == "running", running_b
    assert stopped_b["result"]["content"][0]["text"] == "stopping the run", stopped_b
    assert ended_b["result"]["structuredContent"]["error"] == STOPPED_FROM_VIEW, ended_b

    assert gone["error"]["code"] != NOT_FOUND and "does not answer" in gone["error"]["message"], gone
    assert gone_stop["result"]["isError"] and "does not answer" in gone_stop["result"]["content"][0]["text"]
    assert answered_in < 10, answered_in  # refused connections: no wait for a timeout
    held_id = held_by_b.rsplit("/", 1)[1]
    assert stranger_after["error"] == unknown(held_id, f"{held_by_b}/state"), stranger_after
