"""Long runs as MCP Tasks (the 2025-11-25 design) against a real server, in raw JSON-RPC.

Over real HTTP (plain JSON, as curl speaks it) with two tenants, and over real stdio: a task's
life (working, then completed with the run's output; an error result is completed too), the
status notification, another tenant's id refused exactly like an unknown one, a key re-sent
that runs once, a cancel that leaves no process of the run, and a server killed with -9 whose
task is ``failed`` once a server opens the database again. The Python SDK has no Tasks client; the Tasks extension's own
TypeScript client (@modelcontextprotocol/ext-tasks, installed with the Inspector in
conformance/node_modules) runs one call as a task (ext_tasks_call.mjs).
"""

from __future__ import annotations

import json
import os
import re
import signal
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

from mcp_test_helpers import (
    _CONFORMANCE_MODULES,
    CALL_BOUND,
    _child_pythonpath,
    auth_tokens,
    conformance_node,
    host_processes,
    http_server,
    mcp_sandbox_cli,
    poll,
)

pytestmark = [pytest.mark.e2e, pytest.mark.anyio]

ALICE = "alice-token-0123456789abcdef"
BOB = "bob-token-0123456789abcdef01"
HANDSHAKE = "2025-11-25"


@pytest.fixture(scope="module")
def config(module_state_dir: Path) -> Path:
    path = module_state_dir.parent / f"tasks-{uuid.uuid4().hex[:8]}.toml"
    path.write_text(auth_tokens({"alice": ALICE, "bob": BOB}))
    return path


@pytest.fixture(scope="module")
async def base(module_state_dir: Path, config: Path, sandbox_runtime: Path | None) -> AsyncIterator[str]:
    async with http_server(module_state_dir, "--config", str(config), runtime=sandbox_runtime) as url:
        yield url


async def rpc(base: str, token: str, method: str, params: dict[str, Any]) -> dict[str, Any]:
    """One JSON-RPC request over plain HTTP (no session, as curl sends it); the whole reply."""
    body = {"jsonrpc": "2.0", "id": 1, "method": method, "params": params}
    headers = {"Authorization": f"Bearer {token}", "MCP-Protocol-Version": HANDSHAKE}
    async with httpx2.AsyncClient(timeout=CALL_BOUND * 2) as web:
        reply = await web.post(f"{base}/mcp", json=body, headers=headers)
    assert reply.status_code == 200, reply.text
    message: dict[str, Any] = reply.json()
    return message


async def result(base: str, token: str, method: str, params: dict[str, Any]) -> dict[str, Any]:
    message = await rpc(base, token, method, params)
    assert "error" not in message, message
    answer: dict[str, Any] = message["result"]
    return answer


async def start(base: str, token: str, code: str, **params: Any) -> str:
    call = {"name": "run_python", "arguments": {"code": textwrap.dedent(code)}, "task": {}, **params}
    created = await result(base, token, "tools/call", call)
    assert created["task"]["status"] == "working"
    task_id: str = created["task"]["taskId"]
    return task_id


async def test_the_server_advertises_tasks_and_run_tools_may_run_as_tasks(base: str) -> None:
    init = {"protocolVersion": HANDSHAKE, "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}
    with anyio.fail_after(CALL_BOUND):
        answer = await result(base, ALICE, "initialize", init)
        listing = await result(base, ALICE, "tools/list", {})

    assert answer["capabilities"]["tasks"] == {"list": {}, "cancel": {}, "requests": {"tools": {"call": {}}}}
    execution = {tool["name"]: tool.get("execution") for tool in listing["tools"]}
    assert execution["run_python"] == execution["run_code"] == {"taskSupport": "optional"}
    assert execution["upload_file"] is None


async def test_the_tasks_extensions_own_client_runs_a_call_as_a_task(base: str, tmp_path: Path) -> None:
    # A copy beside a node_modules link: node resolves packages from the script's real path.
    script = tmp_path / "ext_tasks_call.mjs"
    script.write_bytes(Path(__file__).with_name("ext_tasks_call.mjs").read_bytes())
    (tmp_path / "node_modules").symlink_to(_CONFORMANCE_MODULES)
    request = {"url": f"{base}/mcp", "token": ALICE, "code": "import time; time.sleep(1); print(6 * 7)"}
    with anyio.fail_after(CALL_BOUND * 2):
        done = await anyio.run_process([str(conformance_node()), str(script), json.dumps(request)], check=False)
        assert done.returncode == 0, done.stderr.decode(errors="replace")
        ran = json.loads(done.stdout)
        seen = await result(base, ALICE, "tasks/get", {"taskId": ran["taskId"]})

    assert ran["kind"] == "task"
    assert ran["outcome"]["status"] == "completed"
    assert ran["outcome"]["result"]["structuredContent"]["stdout"] == "42\n"
    assert seen["status"] == "completed"  # the same task, asked again over plain HTTP


async def test_a_task_works_then_completes_with_the_runs_output(base: str) -> None:
    with anyio.fail_after(CALL_BOUND * 2):
        task_id = await start(base, ALICE, "import time; time.sleep(1); print('forty-two')")
        seen = await result(base, ALICE, "tasks/get", {"taskId": task_id})
        payload = await result(base, ALICE, "tasks/result", {"taskId": task_id})
        ended = await result(base, ALICE, "tasks/get", {"taskId": task_id})
        listed = await result(base, ALICE, "tasks/list", {})

    assert seen["status"] == "working"
    assert payload["structuredContent"]["stdout"] == "forty-two\n" and payload["isError"] is False
    assert payload["_meta"]["io.modelcontextprotocol/related-task"] == {"taskId": task_id}
    assert ended["status"] == "completed" and ended["ttl"] == 3_600_000
    assert task_id in [task["taskId"] for task in listed["tasks"]]


async def test_a_run_that_fails_is_a_completed_task_with_an_error_result(base: str) -> None:
    with anyio.fail_after(CALL_BOUND * 2):
        task_id = await start(base, ALICE, "raise SystemExit(3)")
        payload = await result(base, ALICE, "tasks/result", {"taskId": task_id})
        ended = await result(base, ALICE, "tasks/get", {"taskId": task_id})

    assert payload["isError"] is True and payload["structuredContent"]["exitCode"] == 3
    assert ended["status"] == "completed"


async def test_another_tenants_task_id_is_refused_exactly_like_an_unknown_one(base: str) -> None:
    with anyio.fail_after(CALL_BOUND * 2):
        task_id = await start(base, ALICE, "print('secret')")
        await result(base, ALICE, "tasks/result", {"taskId": task_id})
        answers = {}
        for method in ("tasks/get", "tasks/result", "tasks/cancel"):
            theirs = await rpc(base, BOB, method, {"taskId": task_id})
            unknown = await rpc(base, BOB, method, {"taskId": "x" * len(task_id)})
            answers[method] = (theirs["error"], unknown["error"])
        listed = await result(base, BOB, "tasks/list", {})

    for theirs, unknown in answers.values():
        assert theirs["code"] == unknown["code"] == -32602
        assert theirs["message"].replace(task_id, "?") == unknown["message"].replace("x" * len(task_id), "?")
    assert task_id not in json.dumps(listed)


async def test_the_operator_lists_every_tenants_tasks_but_never_their_results(
    base: str, module_state_dir: Path, sandbox_runtime: Path | None
) -> None:
    with anyio.fail_after(CALL_BOUND * 2):
        alices = await start(base, ALICE, "print('alice-' + 'private')")
        bobs = await start(base, BOB, "print('bob-' + 'private')")
        await result(base, ALICE, "tasks/result", {"taskId": alices})
        await result(base, BOB, "tasks/result", {"taskId": bobs})
        every = await anyio.to_thread.run_sync(
            lambda: mcp_sandbox_cli("tasks", "--json", state_dir=module_state_dir, runtime=sandbox_runtime)
        )
        only_bob = await anyio.to_thread.run_sync(
            lambda: mcp_sandbox_cli("tasks", "--tenant", "bob", state_dir=module_state_dir, runtime=sandbox_runtime)
        )

    assert every.returncode == 0, every.stderr
    listed = {task["taskId"]: task for task in map(json.loads, every.stdout.splitlines())}
    assert (listed[alices]["tenant"], listed[bobs]["tenant"]) == ("alice", "bob")
    assert listed[alices]["status"] == listed[bobs]["status"] == "completed"
    assert "private" not in every.stdout + only_bob.stdout
    assert bobs in only_bob.stdout and alices not in only_bob.stdout


async def test_a_key_sent_again_returns_the_first_answer_and_runs_once(base: str) -> None:
    conversation = f"conv-{uuid.uuid4().hex}"
    code = "open('/workspace/runs', 'a').write('x'); print(len(open('/workspace/runs').read()))"
    call = {"name": "run_python", "arguments": {"code": code, "conversationId": conversation}}
    key = {"_meta": {"idempotencyKey": f"key-{uuid.uuid4().hex}"}}
    with anyio.fail_after(CALL_BOUND * 2):
        first = await result(base, ALICE, "tools/call", {**call, **key})
        again = await result(base, ALICE, "tools/call", {**call, **key})
        as_task = await result(base, ALICE, "tools/call", {**call, **key, "task": {}})
        fresh = await result(base, ALICE, "tools/call", call)
        other = await rpc(base, ALICE, "tools/call", {**keyed_other(call, "print('other')"), **key})

    assert first["structuredContent"]["stdout"] == again["structuredContent"]["stdout"] == "1\n"
    assert as_task["task"]["status"] == "completed"  # the same key names the same (ended) task
    assert fresh["structuredContent"]["stdout"] == "2\n"  # the code ran once before this call
    assert other["error"]["code"] == -32602 and "idempotencyKey" in other["error"]["message"]


def keyed_other(call: dict[str, Any], code: str) -> dict[str, Any]:
    """``call`` with other code: another request."""
    return {**call, "arguments": {**call["arguments"], "code": code}}


async def test_a_key_re_sent_after_the_connection_was_cut_mid_run_waits_for_the_one_run(base: str) -> None:
    conversation = f"conv-{uuid.uuid4().hex}"
    marker = f"task-key-{uuid.uuid4().hex}"
    code = f"""
        import subprocess, sys
        open('/workspace/runs', 'a').write('x')
        subprocess.run([sys.executable, "-c", "import time; time.sleep(2)", {marker!r}])
        print(len(open('/workspace/runs').read()))
    """
    call = {"name": "run_python", "arguments": {"code": textwrap.dedent(code), "conversationId": conversation}}
    keyed = {**call, "_meta": {"idempotencyKey": f"key-{uuid.uuid4().hex}"}}
    with anyio.fail_after(CALL_BOUND * 2):
        async with anyio.create_task_group() as group:
            group.start_soon(rpc, base, ALICE, "tools/call", keyed)
            await poll(lambda: bool(host_processes(marker)))
            group.cancel_scope.cancel()  # the client hangs up mid-run
        again = await result(base, ALICE, "tools/call", keyed)
        count = {"code": "print(len(open('/workspace/runs').read()))", "conversationId": conversation}
        after = await result(base, ALICE, "tools/call", {"name": "run_python", "arguments": count})

    assert again["structuredContent"]["stdout"] == "1\n"  # the first run's answer, not a second run's
    assert after["structuredContent"]["stdout"] == "1\n"  # the code ran once in all


async def test_a_cancel_ends_every_process_of_the_run_before_it_answers(base: str) -> None:
    marker = f"task-cancel-{uuid.uuid4().hex}"
    code = f"""
        import subprocess, sys, time
        subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)", {marker!r}])
        print("started", flush=True)
        time.sleep(300)
    """
    with anyio.fail_after(CALL_BOUND * 2):
        task_id = await start(base, ALICE, code)
        await poll(lambda: bool(host_processes(marker)))
        while "_meta" not in (seen := await result(base, ALICE, "tasks/get", {"taskId": task_id})):  # noqa: ASYNC110 - polled, as a client does
            await anyio.sleep(0.05)
        began = time.perf_counter()
        cancelled = await result(base, ALICE, "tasks/cancel", {"taskId": task_id})
        elapsed = time.perf_counter() - began
        left = host_processes(marker)
        payload = await rpc(base, ALICE, "tasks/result", {"taskId": task_id})
        again = await rpc(base, ALICE, "tasks/cancel", {"taskId": task_id})

    assert seen["status"] == "working" and seen["_meta"] == {"mcp-sandbox/lastOutput": "started"}
    assert re.fullmatch(r"running for \d+ s; last output: started", seen["statusMessage"])
    assert cancelled["status"] == "cancelled" and left == []
    assert elapsed < 5, elapsed
    assert payload["error"]["data"]["status"] == "cancelled"
    assert again["error"]["code"] == -32602


async def test_a_task_only_runs_tools_that_declare_it(base: str) -> None:
    call = {"name": "list_runners", "arguments": {}, "task": {}}
    with anyio.fail_after(CALL_BOUND):
        refused = await rpc(base, ALICE, "tools/call", call)
        bad_ttl = await rpc(base, ALICE, "tools/call", {"name": "run_python", "arguments": {}, "task": {"ttl": "x"}})

    assert refused["error"]["code"] == -32601 and "list_runners" in refused["error"]["message"]
    assert bad_ttl["error"]["code"] == -32602 and "params.task.ttl" in bad_ttl["error"]["message"]


async def test_the_task_of_a_server_killed_mid_run_is_failed_not_working(
    state_dir: Path, config: Path, sandbox_runtime: Path | None
) -> None:
    with anyio.fail_after(CALL_BOUND * 3):
        async with http_server(state_dir, "--config", str(config), runtime=sandbox_runtime) as url:
            task_id = await start(url, ALICE, "import time; time.sleep(300)")
            port = url.rsplit(":", 1)[1]
            # Exactly this port (not a longer one with the same digits first), and the server itself,
            # not a child it forked that has not yet exec'd.
            (pid,) = [p for p in host_processes(f"--port\x00{port}\x00") if _is_server(p)]
            os.kill(pid, signal.SIGKILL)
        async with http_server(state_dir, "--config", str(config), runtime=sandbox_runtime) as url:
            seen = await result(url, ALICE, "tasks/get", {"taskId": task_id})
            payload = await rpc(url, ALICE, "tasks/result", {"taskId": task_id})

    assert seen["status"] == "failed" and "stopped before it finished" in seen["statusMessage"]
    assert payload["error"]["data"]["status"] == "failed"


async def test_the_task_of_a_server_shut_down_mid_run_is_failed_saying_so(
    state_dir: Path, config: Path, sandbox_runtime: Path | None
) -> None:
    grace = {"MCP_SANDBOX_SHUTDOWN_GRACE": "0.5s"}
    with anyio.fail_after(CALL_BOUND * 3):
        async with http_server(state_dir, "--config", str(config), runtime=sandbox_runtime, env=grace) as url:
            task_id = await start(url, ALICE, "import time; time.sleep(300)")
        # Leaving the block sent SIGTERM: the drain ended the run, and the server exited.
        async with http_server(state_dir, "--config", str(config), runtime=sandbox_runtime) as url:
            seen = await result(url, ALICE, "tasks/get", {"taskId": task_id})

    assert seen["status"] == "failed" and "shut down" in seen["statusMessage"]


def _is_server(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as cmdline, open(f"/proc/{pid}/stat", "rb") as stat:
            parent = int(stat.read().rsplit(b")", 1)[1].split()[1])
            return b"mcp_sandbox\x00serve" in cmdline.read() and parent == os.getpid()
    except OSError:  # exited since it was listed
        return False


async def test_over_stdio_a_task_completes_and_its_status_is_notified(
    state_dir: Path, sandbox_runtime: Path | None
) -> None:
    env = {"PATH": os.environ["PATH"], "MCP_SANDBOX_DISCOVER_SERVERS": "false"}
    if (pythonpath := _child_pythonpath()) is not None:
        env["PYTHONPATH"] = pythonpath
    if sandbox_runtime is not None:
        env["MCP_SANDBOX_PYTHON_RUNTIME"] = str(sandbox_runtime)
    command = [sys.executable, "-m", "mcp_sandbox", "serve", "--state-dir", str(state_dir)]
    init = {"protocolVersion": HANDSHAKE, "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}
    call = {"name": "run_python", "arguments": {"code": "print('over stdio')"}, "task": {"ttl": 60_000}}
    with anyio.fail_after(CALL_BOUND * 2):
        async with await anyio.open_process(command, env=env, stderr=subprocess.DEVNULL) as server:
            assert server.stdin is not None and server.stdout is not None
            lines = _Lines(server.stdout)

            async def send(message: dict[str, Any]) -> None:
                assert server.stdin is not None
                await server.stdin.send(json.dumps({"jsonrpc": "2.0", **message}).encode() + b"\n")

            await send({"id": 1, "method": "initialize", "params": init})
            assert "tasks" in (await lines.reply(1))["result"]["capabilities"]
            await send({"method": "notifications/initialized"})
            await send({"id": 2, "method": "tools/call", "params": call})
            task_id = (await lines.reply(2))["result"]["task"]["taskId"]
            await send({"id": 3, "method": "tasks/result", "params": {"taskId": task_id}})
            payload = (await lines.reply(3))["result"]
            await server.stdin.aclose()

    assert payload["structuredContent"]["stdout"] == "over stdio\n"
    statuses = [m["params"] for m in lines.seen if m.get("method") == "notifications/tasks/status"]
    assert statuses and statuses[-1]["taskId"] == task_id and statuses[-1]["status"] == "completed"


class _Lines:
    """The server's stdout as JSON-RPC messages; what came before a reply is kept in ``seen``."""

    def __init__(self, stream: Any) -> None:
        self._stream = stream
        self._buffer = b""
        self.seen: list[dict[str, Any]] = []

    async def reply(self, request_id: int) -> dict[str, Any]:
        while True:
            while b"\n" not in self._buffer:
                self._buffer += await self._stream.receive()
            line, self._buffer = self._buffer.split(b"\n", 1)
            message: dict[str, Any] = json.loads(line)
            self.seen.append(message)
            if message.get("id") == request_id:
                return message
