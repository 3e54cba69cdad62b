"""Long runs as tasks of the 2026-07-28 Tasks extension against a real server, in raw JSON-RPC.

Over real HTTP (one self-contained POST per request, as curl sends it) with two tenants and a
short ``task_after``, and over real stdio: a declaring client's short call answered at once, a
long one answered with a task whose ``tasks/get`` says the run's last line and then inlines its
result; a client that declared nothing keeps the blocking call and is refused ``tasks/*``; the
methods this revision dropped; unknown and other tenants' ids; a cancel that leaves no process.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import httpx2
import pytest

from mcp_test_helpers import CALL_BOUND, _child_pythonpath, auth_tokens, host_processes, http_server, poll

pytestmark = [pytest.mark.e2e, pytest.mark.anyio]

ALICE = "alice-token-0123456789abcdef"
BOB = "bob-token-0123456789abcdef01"
MODERN = "2026-07-28"
EXTENSION = "io.modelcontextprotocol/tasks"
TASK_AFTER = 4.0  # above a cold run under load: a short call is answered at once


def meta(*, declared: bool) -> dict[str, Any]:
    capabilities: dict[str, Any] = {"extensions": {EXTENSION: {}}} if declared else {}
    return {
        "io.modelcontextprotocol/protocolVersion": MODERN,
        "io.modelcontextprotocol/clientInfo": {"name": "t", "version": "1"},
        "io.modelcontextprotocol/clientCapabilities": capabilities,
    }


@pytest.fixture(scope="module")
async def base(module_state_dir: Path, sandbox_runtime: Path | None) -> AsyncIterator[str]:
    config = module_state_dir.parent / f"tasks-ext-{uuid.uuid4().hex[:8]}.toml"
    config.write_text(auth_tokens({"alice": ALICE, "bob": BOB}))
    env = {"MCP_SANDBOX_TASK_AFTER": f"{TASK_AFTER}s"}
    async with http_server(module_state_dir, "--config", str(config), runtime=sandbox_runtime, env=env) as url:
        yield url


async def rpc(base: str, token: str, method: str, params: dict[str, Any], *, declared: bool = True) -> dict[str, Any]:
    """One request of the 2026-07-28 revision over plain HTTP; the whole reply."""
    framed = {**params, "_meta": {**params.get("_meta", {}), **meta(declared=declared)}}
    body = {"jsonrpc": "2.0", "id": 1, "method": method, "params": framed}
    name = params.get("name") if method == "tools/call" else params.get("taskId")
    headers = {
        "Authorization": f"Bearer {token}",
        "MCP-Protocol-Version": MODERN,
        "Mcp-Method": method,
        "Accept": "application/json, text/event-stream",
        **({"Mcp-Name": name} if isinstance(name, str) else {}),
    }
    async with httpx2.AsyncClient(timeout=CALL_BOUND * 2) as web:
        reply = await web.post(f"{base}/mcp", json=body, headers=headers)
    message: dict[str, Any] = reply.json()
    assert "result" in message or "error" in message, reply.text
    return message


async def result(base: str, token: str, method: str, params: dict[str, Any], **kw: Any) -> dict[str, Any]:
    message = await rpc(base, token, method, params, **kw)
    assert "error" not in message, message
    answer: dict[str, Any] = message["result"]
    return answer


def run(code: str, **params: Any) -> dict[str, Any]:
    return {"name": "run_python", "arguments": {"code": textwrap.dedent(code)}, **params}


async def ended(base: str, token: str, task_id: str) -> dict[str, Any]:
    """tasks/get until the task has ended (the caller bounds the wait)."""
    while True:
        task = await result(base, token, "tasks/get", {"taskId": task_id})
        if task["status"] != "working":
            return task
        await anyio.sleep(0.2)


async def test_discovery_advertises_the_extension(base: str) -> None:
    with anyio.fail_after(CALL_BOUND):
        found = await result(base, ALICE, "server/discover", {})

    assert found["capabilities"]["extensions"][EXTENSION] == {}
    assert "tasks" not in found["capabilities"]  # the 2025-11-25 capability is the handshake era's


async def test_a_short_call_is_answered_at_once_a_long_one_with_a_task_then_its_result(base: str) -> None:
    code = """
        import time
        for step in range(4):
            print(f"step {step}", flush=True)
            time.sleep(1.9)
        print("done")
    """
    with anyio.fail_after(CALL_BOUND * 2):
        short = await result(base, ALICE, "tools/call", run("print(6 * 7)"))
        began = time.perf_counter()
        created = await result(base, ALICE, "tools/call", run(code))
        handed = time.perf_counter() - began
        task_id = created["taskId"]
        seen = await result(base, ALICE, "tasks/get", {"taskId": task_id})
        final = await ended(base, ALICE, task_id)

    assert short["resultType"] == "complete" and short["structuredContent"]["stdout"] == "42\n"
    assert created["resultType"] == "task" and created["status"] == "working"
    assert created["ttlMs"] == 3_600_000 and created["pollIntervalMs"] > 0 and len(task_id) >= 32
    assert handed >= TASK_AFTER
    assert seen["resultType"] == "complete" and seen["status"] == "working"
    assert seen["statusMessage"].startswith("running for ") and "; last output: step " in seen["statusMessage"]
    assert final["status"] == "completed" and "error" not in final
    assert final["result"]["structuredContent"]["stdout"] == "step 0\nstep 1\nstep 2\nstep 3\ndone\n"
    assert final["result"]["resultType"] == "complete" and final["result"]["isError"] is False
    # Both answers link the run's MCP Apps view: the task at once, the result when it is inlined.
    view = created["_meta"]["ui"]["resourceUri"]
    assert view.startswith("ui://mcp-sandbox/run/") and short["_meta"]["ui"]["resourceUri"] != view
    assert final["result"]["_meta"]["ui"]["resourceUri"] == view


async def test_a_client_that_declared_nothing_keeps_the_blocking_call_and_is_refused_tasks(base: str) -> None:
    with anyio.fail_after(CALL_BOUND * 2):
        blocking = await result(
            base, ALICE, "tools/call", run("import time; time.sleep(1); print('x')"), declared=False
        )
        created = await result(base, ALICE, "tools/call", run("import time; time.sleep(5.5)"))
        refused = {
            method: await rpc(base, ALICE, method, {"taskId": created["taskId"], "inputResponses": {}}, declared=False)
            for method in ("tasks/get", "tasks/update", "tasks/cancel")
        }

    assert blocking["resultType"] == "complete" and blocking["structuredContent"]["stdout"] == "x\n"
    for answer in refused.values():
        assert answer["error"]["code"] == -32021
        assert answer["error"]["data"] == {"requiredCapabilities": {"extensions": {EXTENSION: {}}}}


async def test_the_methods_this_revision_dropped_are_not_found_and_unknown_ids_are_invalid(base: str) -> None:
    unknown = {"taskId": "x" * 32}
    with anyio.fail_after(CALL_BOUND):
        dropped = [await rpc(base, ALICE, method, unknown) for method in ("tasks/result", "tasks/list")]
        refused = [
            await rpc(base, ALICE, method, {**unknown, "inputResponses": {}})
            for method in ("tasks/get", "tasks/update", "tasks/cancel")
        ]

    assert [answer["error"]["code"] for answer in dropped] == [-32601, -32601]
    assert [answer["error"]["code"] for answer in refused] == [-32602, -32602, -32602]


async def test_another_tenants_task_is_refused_exactly_like_an_unknown_one(base: str) -> None:
    with anyio.fail_after(CALL_BOUND * 2):
        created = await result(base, ALICE, "tools/call", run("import time; time.sleep(5.5); print('secret')"))
        task_id = created["taskId"]
        answers = []
        for method in ("tasks/get", "tasks/update", "tasks/cancel"):
            theirs = await rpc(base, BOB, method, {"taskId": task_id, "inputResponses": {}})
            unknown = await rpc(base, BOB, method, {"taskId": "y" * len(task_id), "inputResponses": {}})
            answers.append((theirs["error"], unknown["error"]))
        final = await ended(base, ALICE, task_id)

    for theirs, unknown in answers:
        assert theirs["code"] == unknown["code"] == -32602
        assert theirs["message"].replace(task_id, "?") == unknown["message"].replace("y" * len(task_id), "?")
    assert final["status"] == "completed"  # bob's cancel did not reach it


async def test_an_update_is_acknowledged_and_a_malformed_one_refused(base: str) -> None:
    with anyio.fail_after(CALL_BOUND * 2):
        created = await result(base, ALICE, "tools/call", run("import time; time.sleep(5.5)"))
        task_id = created["taskId"]
        acknowledged = await result(base, ALICE, "tasks/update", {"taskId": task_id, "inputResponses": {"k": {}}})
        malformed = await rpc(base, ALICE, "tasks/update", {"taskId": task_id, "inputResponses": []})
        await ended(base, ALICE, task_id)

    assert acknowledged["resultType"] == "complete"
    assert malformed["error"]["code"] == -32602 and "inputResponses" in malformed["error"]["message"]


async def test_a_cancel_ends_every_process_of_the_run_and_the_task_reads_cancelled(base: str) -> None:
    marker = f"ext-cancel-{uuid.uuid4().hex}"
    code = f"""
        import subprocess, sys, time
        subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)", {marker!r}])
        time.sleep(300)
    """
    with anyio.fail_after(CALL_BOUND * 2):
        task_id = (await result(base, ALICE, "tools/call", run(code)))["taskId"]
        await poll(lambda: bool(host_processes(marker)))
        acknowledged = await result(base, ALICE, "tasks/cancel", {"taskId": task_id})
        left = host_processes(marker)
        seen = await result(base, ALICE, "tasks/get", {"taskId": task_id})
        again = await result(base, ALICE, "tasks/cancel", {"taskId": task_id})

    assert acknowledged["resultType"] == "complete" and left == []
    assert seen["status"] == "cancelled" and "result" not in seen and "error" not in seen
    assert again["resultType"] == "complete"  # a cancel of an ended task is acknowledged too


async def test_a_client_that_hangs_up_before_it_has_the_task_stops_the_run(base: str) -> None:
    marker = f"ext-hangup-{uuid.uuid4().hex}"
    code = f"""
        import subprocess, sys, time
        subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)", {marker!r}])
        time.sleep(300)
    """
    with anyio.fail_after(CALL_BOUND * 2):
        async with anyio.create_task_group() as group:
            group.start_soon(rpc, base, ALICE, "tools/call", run(code))
            await poll(lambda: bool(host_processes(marker)))
            group.cancel_scope.cancel()  # before task_after: the client never had the task's id
        await poll(lambda: not host_processes(marker))


async def test_a_key_sent_again_returns_the_first_calls_task_or_result_and_runs_once(base: str) -> None:
    code = "import time; open('/workspace/runs', 'a').write('x'); time.sleep(5.5); print(len(open('/workspace/runs').read()))"  # noqa: E501
    arguments = {"code": code, "conversationId": f"conv-{uuid.uuid4().hex}"}
    call = {"name": "run_python", "arguments": arguments, "_meta": {"idempotencyKey": f"key-{uuid.uuid4().hex}"}}
    with anyio.fail_after(CALL_BOUND * 2):
        first = await result(base, ALICE, "tools/call", call)
        again = await result(base, ALICE, "tools/call", call)  # a task still, or its result by now
        final = await ended(base, ALICE, first["taskId"])
        after = await result(base, ALICE, "tools/call", call)

    assert first["resultType"] == "task"
    assert again.get("taskId", first["taskId"]) == first["taskId"]
    assert final["result"]["structuredContent"]["stdout"] == "1\n"
    assert after["resultType"] == "complete" and after["structuredContent"]["stdout"] == "1\n"  # ran once


async def test_over_stdio_a_long_call_is_a_task_and_get_inlines_its_result(
    state_dir: Path, sandbox_runtime: Path | None
) -> None:
    env = {"PATH": os.environ["PATH"], "MCP_SANDBOX_DISCOVER_SERVERS": "false", "MCP_SANDBOX_TASK_AFTER": "0s"}
    if (pythonpath := _child_pythonpath()) is not None:
        env["PYTHONPATH"] = pythonpath
    if sandbox_runtime is not None:
        env["MCP_SANDBOX_PYTHON_RUNTIME"] = str(sandbox_runtime)
    command = [sys.executable, "-m", "mcp_sandbox", "serve", "--state-dir", str(state_dir)]
    with anyio.fail_after(CALL_BOUND * 2):
        async with await anyio.open_process(command, env=env, stderr=subprocess.DEVNULL) as server:
            assert server.stdin is not None and server.stdout is not None
            replies = _Replies(server.stdout)

            async def ask(request_id: int, method: str, params: dict[str, Any]) -> dict[str, Any]:
                assert server.stdin is not None
                framed = {**params, "_meta": meta(declared=True)}
                message = {"jsonrpc": "2.0", "id": request_id, "method": method, "params": framed}
                await server.stdin.send(json.dumps(message).encode() + b"\n")
                return await replies.reply(request_id)

            created = (await ask(1, "tools/call", run("import time; time.sleep(0.5); print('over stdio')")))["result"]
            request_id = 2
            while (task := (await ask(request_id, "tasks/get", {"taskId": created["taskId"]}))["result"])[
                "status"
            ] == "working":
                request_id += 1
                await anyio.sleep(0.2)
            await server.stdin.aclose()

    assert created["resultType"] == "task"
    assert task["status"] == "completed" and task["result"]["structuredContent"]["stdout"] == "over stdio\n"


class _Replies:
    """The server's stdout as JSON-RPC messages."""

    def __init__(self, stream: Any) -> None:
        self._stream = stream
        self._buffer = b""

    async def reply(self, request_id: int) -> dict[str, Any]:
        while True:
            while b"\n" not in self._buffer:
                self._buffer += await self._stream.receive()
            line, self._buffer = self._buffer.split(b"\n", 1)
            message: dict[str, Any] = json.loads(line)
            if message.get("id") == request_id:
                return message
