"""Tasks with replicas, for real: two server processes on loopback sharing a PostgreSQL database.

A task started on one replica is answered by the other: its ``tasks/get`` is asked of the owner
(the live ``statusMessage`` with the run's last line comes only from there), its ``tasks/cancel``
ends the run's processes on the owner before it answers, and once the owner is killed with -9
mid-run the task reads ``failed`` within the lease, never ``working``. In the 2026-07-28
revision's raw JSON-RPC (the extension's tasks, ``task_after`` 0: every run is a task).
"""

from __future__ import annotations

import textwrap
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import httpx2
import pytest

from mcp_test_helpers import CALL_BOUND, host_processes, poll
from postgres_helpers import Cluster
from replica_helpers import TOKEN, long_run, replicas

pytestmark = [pytest.mark.e2e, pytest.mark.anyio, pytest.mark.slow]

MODERN = "2026-07-28"
LEASE = 3.0
META = {
    "io.modelcontextprotocol/protocolVersion": MODERN,
    "io.modelcontextprotocol/clientInfo": {"name": "t", "version": "1"},
    "io.modelcontextprotocol/clientCapabilities": {"extensions": {"io.modelcontextprotocol/tasks": {}}},
}


async def result(url: str, method: str, params: dict[str, Any]) -> dict[str, Any]:
    body = {"jsonrpc": "2.0", "id": 1, "method": method, "params": {**params, "_meta": META}}
    name = params.get("name") if method == "tools/call" else params.get("taskId")
    headers = {
        "Authorization": f"Bearer {TOKEN}",
        "MCP-Protocol-Version": MODERN,
        "Mcp-Method": method,
        "Mcp-Name": str(name),
        "Accept": "application/json, text/event-stream",
    }
    async with httpx2.AsyncClient(timeout=CALL_BOUND) as web:
        reply = await web.post(f"{url}/mcp", json=body, headers=headers)
    message: dict[str, Any] = reply.json()
    assert "result" in message, message
    answer: dict[str, Any] = message["result"]
    return answer


async def start(url: str, code: str) -> str:
    created = await result(url, "tools/call", {"name": "run_python", "arguments": {"code": textwrap.dedent(code)}})
    assert created["resultType"] == "task", created
    task_id: str = created["taskId"]
    return task_id


async def until(url: str, task_id: str, holds: Callable[[dict[str, Any]], bool]) -> dict[str, Any]:
    """``tasks/get`` of ``task_id`` on ``url`` until ``holds(task)`` (the caller bounds the wait)."""
    while True:
        task = await result(url, "tasks/get", {"taskId": task_id})
        if holds(task):
            return task
        await anyio.sleep(0.1)


async def test_the_other_replica_answers_a_task_from_its_owner_and_the_database(
    postgres: Cluster, sandbox_runtime: Path | None
) -> None:
    url = postgres.create_database()
    env = {"MCP_SANDBOX_REPLICA_LEASE": f"{LEASE:g}", "MCP_SANDBOX_TASK_AFTER": "0"}
    async with replicas(2, url, sandbox_runtime, **env) as (owner, other):
        cancelled_marker, killed_marker = f"cancel-{uuid.uuid4().hex}", f"killed-{uuid.uuid4().hex}"
        with anyio.fail_after(CALL_BOUND * 2):
            done = await start(owner.url, "print('from the owner')")
            to_cancel = await start(owner.url, long_run(cancelled_marker))
            await poll(lambda: bool(host_processes(cancelled_marker)))
            seen = await until(other.url, to_cancel, lambda task: "tick" in task.get("statusMessage", ""))
            await result(other.url, "tasks/cancel", {"taskId": to_cancel})
            left = host_processes(cancelled_marker)
            cancelled = await result(other.url, "tasks/get", {"taskId": to_cancel})
            finished = await until(other.url, done, lambda task: task["status"] != "working")

            to_kill = await start(owner.url, long_run(killed_marker))
            await poll(lambda: bool(host_processes(killed_marker)))
            killed_at = time.monotonic()
            await owner.kill()
            lost = await until(other.url, to_kill, lambda task: task["status"] != "working")
            failed_after = time.monotonic() - killed_at

    assert seen["status"] == "working" and "last output: tick 1" in seen["statusMessage"]  # the owner's word
    assert left == [] and cancelled["status"] == "cancelled"  # stopped on the owner before the answer
    assert finished["status"] == "completed"
    assert finished["result"]["structuredContent"]["stdout"] == "from the owner\n"
    assert lost["status"] == "failed" and "stopped before it finished" in lost["statusMessage"]
    assert failed_after < LEASE * 2 + 2, failed_after  # the lease, and the beat that reads it
