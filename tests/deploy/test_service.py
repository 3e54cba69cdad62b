"""The server as an operator runs it: health, readiness, metrics, audit log, SIGTERM drain, SIGHUP reload.

A real ``mcp-sandbox serve --transport http`` process, driven by the SDK's client over HTTP and
by plain HTTP requests; signals are sent to that process.
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import tempfile
import textwrap
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import anyio.abc
import httpx2
import pytest
from mcp import Client
from mcp.types import CallToolResult

from downstream import FIXTURE_SERVER
from mcp_test_helpers import CALL_BOUND, _server_env, _stop_server, _wait_listening, free_port, http_client

from .test_metrics import ALERTS, dashboard_metrics

pytestmark = [pytest.mark.e2e, pytest.mark.anyio]

ALICE = "alice-token-0123456789abcdef"
BOB = "bob-token-0123456789abcdef0000"
METRICS = "metrics-token-0123456789abcdef"
FILE_TOKEN = "file-token-0123456789abcdef000"
NEW_FILE_TOKEN = "file-token-rotated-0123456789ab"
SECRET_VALUE = "env-value-that-must-not-be-logged"
CODE_MARK = "code_marker_not_in_the_log"
OUTPUT_MARK = "output-marker-not-in-the-log"
CONVERSATION = "conversation-id-not-in-the-log"
MADE_UP_TOOL = "made_up_tool_name_not_in_the_log"
TOOL_CODE = f"""
import mcp
print(await mcp_fixture.add(a=2, b=3))
try:
    await mcp.runtime.call_tool("fixture", "{MADE_UP_TOOL}", {{}})
except mcp.runtime.MCPError:
    print("refused")
"""


def config_text(*, bob: bool, deny: list[str]) -> str:
    bob_line = f'{{ tenant = "bob", token = "{BOB}" }},' if bob else ""
    return textwrap.dedent(f"""
        discover_servers = false
        [auth]
        tokens = [{{ tenant = "alice", token = "{ALICE}" }}, {bob_line}]
        [servers.fixture]
        command = "{sys.executable}"
        args = ["{FIXTURE_SERVER}"]
        deny_tools = {json.dumps(deny)}
        """)


class Server:
    def __init__(self, base: str, process: anyio.abc.Process, config: Path, state: Path) -> None:
        self.base = base
        self.process = process
        self.config = config
        self.state = state

    def audit(self) -> list[dict[str, Any]]:
        path = self.state / "logs" / "audit.jsonl"
        return [json.loads(line) for line in path.read_text().splitlines()]


@asynccontextmanager
async def server(state_dir: Path, runtime: Path | None, **env: str) -> AsyncIterator[Server]:
    config = state_dir.parent / "server.toml"
    config.write_text(config_text(bob=False, deny=[]))
    token_file = state_dir.parent / "token"
    token_file.write_text(FILE_TOKEN + "\n")
    port = free_port()
    command = [sys.executable, "-m", "mcp_sandbox", "serve", "--transport", "http", "--port", str(port)]
    command += ["--state-dir", str(state_dir), "--config", str(config)]
    environment = {
        "MCP_SANDBOX_METRICS_TOKEN": METRICS,
        "MCP_SANDBOX_SHUTDOWN_GRACE": "30",
        "MCP_SANDBOX_TOKEN_FILE": str(token_file),
        **env,
    }
    with tempfile.TemporaryFile() as log:
        process = await anyio.open_process(
            command,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
            env=_server_env(runtime, environment),
            start_new_session=True,
        )
        try:
            with anyio.fail_after(60):
                await _wait_listening(process, "127.0.0.1", port)
            yield Server(f"http://127.0.0.1:{port}", process, config, state_dir)
        except BaseException:
            log.seek(0)
            print(log.read().decode(errors="replace")[-4000:])
            raise
        finally:
            with anyio.CancelScope(shield=True):
                await _stop_server(process, 15)


async def call(client: Client, tool: str, arguments: dict[str, Any]) -> CallToolResult:
    with anyio.fail_after(CALL_BOUND * 2):
        return await client.call_tool(tool, arguments)


def data(result: CallToolResult) -> dict[str, Any]:
    assert result.structured_content is not None, result
    found: dict[str, Any] = result.structured_content
    return found


async def until(check: Callable[[], Awaitable[bool]], bound: float = 30) -> None:
    """Poll another process's HTTP answers: there is nothing to wait on but the answer itself."""
    with anyio.fail_after(bound):
        while True:
            if await check():
                return
            await anyio.sleep(0.05)


async def metric(web: httpx2.AsyncClient, base: str, name: str, **labels: str) -> float:
    """The value of one sample of ``/metrics`` (0 when absent)."""
    reply = await web.get(f"{base}/metrics", headers={"Authorization": f"Bearer {METRICS}"})
    assert reply.status_code == 200, reply.text
    wanted = ",".join(f'{key}="{value}"' for key, value in sorted(labels.items()))
    for line in reply.text.splitlines():
        match = re.match(r"^([a-z_]+)(?:\{(.*)\})? (\S+)$", line)
        if match and match.group(1) == name:
            got = ",".join(sorted((match.group(2) or "").split(","))) if match.group(2) else ""
            if got == wanted:
                return float(match.group(3))
    return 0.0


async def scrape(web: httpx2.AsyncClient, base: str) -> str:
    reply = await web.get(f"{base}/metrics", headers={"Authorization": f"Bearer {METRICS}"})
    assert reply.status_code == 200, reply.text
    return reply.text


async def metric_sum(web: httpx2.AsyncClient, base: str, name: str, **labels: str) -> float:
    """The sum of the samples of ``name`` whose labels include ``labels`` (0 when none)."""
    total = 0.0
    for line in (await scrape(web, base)).splitlines():
        match = re.match(r"^([a-z_]+)(?:\{(.*)\})? (\S+)$", line)
        if match and match.group(1) == name:
            found = dict(re.findall(r'([a-z_]+)="([^"]*)"', match.group(2) or ""))
            if all(found.get(key) == value for key, value in labels.items()):
                total += float(match.group(3))
    return total


@pytest.fixture
async def live(state_dir: Path, sandbox_runtime: Path | None) -> AsyncIterator[Server]:
    async with server(state_dir, sandbox_runtime) as running:
        yield running


async def test_health_readiness_metrics_and_audit_follow_what_runs(live: Server) -> None:
    base = live.base
    async with httpx2.AsyncClient(timeout=CALL_BOUND) as web:
        health = await web.get(f"{base}/healthz")
        assert (health.status_code, health.json()) == (200, {"status": "ok"})

        async def ready() -> bool:
            return (await web.get(f"{base}/readyz")).status_code == 200

        await until(ready, 60)
        assert (await web.get(f"{base}/readyz")).json() == {"status": "ready"}
        assert (await web.get(f"{base}/metrics")).status_code == 401
        wrong = await web.get(f"{base}/metrics", headers={"Authorization": f"Bearer {ALICE}"})
        assert wrong.status_code == 401

        runs_before = await metric(web, base, "mcp_sandbox_runs_total", language="python", backend="bwrap",
                                   status="success", tenant="alice")  # fmt: skip
        async with http_client(base, ALICE) as client:
            code = f"import os\n{CODE_MARK} = 1\nprint('{OUTPUT_MARK}', os.environ['KEY'][:3])"
            result = await call(client, "run_code", {"code": code, "language": "python",
                                                     "environment": {"KEY": SECRET_VALUE}})  # fmt: skip
            assert data(result)["status"] == "success", data(result)
            upload = await call(client, "upload_file", {"conversationId": CONVERSATION, "filename": "in.txt",
                                                         "content": "aGVsbG8="})  # fmt: skip
            assert not upload.is_error, upload
            made = await call(client, "run_python", {"code": "open('/workspace/out.txt','w').write('x'*10)",
                                                     "conversationId": CONVERSATION})  # fmt: skip
            files = {entry["name"]: entry["url"] for entry in data(made)["files"]}
            tool = await call(client, "run_python", {"code": TOOL_CODE, "servers": ["fixture"]})
            assert data(tool)["stdout"].split() == ["{'result':", "5}", "refused"], data(tool)
            slow = await call(client, "run_python", {"code": "while True: pass", "timeout": 1})
            assert data(slow)["status"] == "timeout"
        download = await web.get(files["out.txt"])
        assert download.status_code == 200 and download.content == b"x" * 10

        after = await metric(web, base, "mcp_sandbox_runs_total", language="python", backend="bwrap",
                             status="success", tenant="alice")  # fmt: skip
        assert after == runs_before + 3
        assert await metric(web, base, "mcp_sandbox_limit_events_total", limit="timeout") == 1
        assert await metric(web, base, "mcp_sandbox_tool_calls_total", server="fixture", outcome="ok") == 1
        assert await metric(web, base, "mcp_sandbox_uploads_total", via="tool", outcome="ok") == 1
        assert await metric(web, base, "mcp_sandbox_downloads_total", outcome="ok") == 1
        assert await metric_sum(web, base, "mcp_sandbox_run_duration_seconds_count", language="python",
                                backend="bwrap") == 4  # fmt: skip
        assert await metric_sum(web, base, "mcp_sandbox_run_duration_seconds_count", path="session") == 1
        assert await metric_sum(web, base, "mcp_sandbox_run_failures_total", cause="timeout", tenant="alice") == 1
        assert await metric(web, base, "mcp_sandbox_stored_bytes", tenant="alice") == 15
        assert await metric(web, base, "mcp_sandbox_sessions") == 1
        assert await metric(web, base, "mcp_sandbox_queue_wait_seconds_count") == 4
        assert await metric(web, base, "mcp_sandbox_queue_length") == 0
        assert await metric(web, base, "mcp_sandbox_warm_pool_size") >= 1

    lines = live.audit()
    events = [line["event"] for line in lines]
    assert events.count("run") == 4 and events.count("upload") == 1
    assert events.count("download") == 1 and events.count("tool_call") == 2
    first = next(line for line in lines if line["event"] == "run")
    assert first["tenant"] == "alice" and first["status"] == "success" and first["language"] == "python"
    assert first["stdout_bytes"] > 0 and first["duration"] > 0 and re.match(r"^\d{4}-\d\d-\d\dT", first["time"])
    calls = [line for line in lines if line["event"] == "tool_call"]
    assert (calls[0]["server"], calls[0]["tool"], calls[0]["outcome"]) == ("fixture", "add", "ok")
    assert (calls[1]["server"], calls[1]["tool"]) == ("fixture", "unknown") and calls[1]["outcome"] != "ok"
    download_line = next(line for line in lines if line["event"] == "download")
    assert download_line["size"] == 10 and download_line["outcome"] == "ok"
    timeout_line = [line for line in lines if line["event"] == "run"][-1]
    assert timeout_line["limits"] == ["timeout"]
    raw = (live.state / "logs" / "audit.jsonl").read_text()
    for secret in (ALICE, METRICS, SECRET_VALUE, CODE_MARK, OUTPUT_MARK, CONVERSATION, MADE_UP_TOOL):
        assert secret not in raw


async def test_sigterm_lets_a_running_run_finish_and_refuses_new_ones(live: Server) -> None:
    async with http_client(live.base, ALICE) as client, httpx2.AsyncClient(timeout=CALL_BOUND) as web:
        results: list[CallToolResult] = []
        # The SDK's client lists the tools before it accepts a first result (to check it against
        # the output schema): asked after the long run's answer, that request raced the drained
        # server's exit. Listed now, the answer is the last thing the client needs from it.
        await client.list_tools()

        async def long_run() -> None:
            code = "import time\nprint('begun', flush=True)\ntime.sleep(3)\nprint('finished')"
            results.append(await call(client, "run_python", {"code": code}))

        async with anyio.create_task_group() as group:
            group.start_soon(long_run)

            async def running() -> bool:
                return await metric(web, live.base, "mcp_sandbox_runs_running") >= 1

            async def draining() -> bool:
                return (await web.get(f"{live.base}/readyz")).status_code == 503

            await until(running)
            live.process.send_signal(signal.SIGTERM)
            await until(draining, 10)
            refused = await call(client, "run_python", {"code": "print(1)"})
            assert refused.is_error and "shutting down" in data(refused)["error"]
        assert data(results[0])["status"] == "success" and "finished" in data(results[0])["stdout"]
    with anyio.fail_after(30):
        await live.process.wait()
    assert live.process.returncode == 0
    statuses = sorted(line["status"] for line in live.audit() if line["event"] == "run")
    assert statuses == ["busy", "success"]


def _audit_or_empty(live: Server) -> list[dict[str, Any]]:
    try:
        return live.audit()
    except FileNotFoundError:
        return []


async def test_sighup_reloads_tokens_and_tool_policy_and_keeps_sessions(live: Server) -> None:
    async def upload_status(token: str) -> int:
        async with httpx2.AsyncClient(timeout=CALL_BOUND) as web:
            reply = await web.post(f"{live.base}/upload?conversationId=b&filename=x.txt", content=b"1",
                                   headers={"Authorization": f"Bearer {token}"})  # fmt: skip
            return reply.status_code

    assert await upload_status(FILE_TOKEN) == 201
    assert await upload_status(BOB) == 401
    async with http_client(live.base, ALICE) as client:
        first = await call(client, "run_python", {"code": "kept = 41", "conversationId": "s"})
        assert data(first)["status"] == "success"
        allowed = await call(client, "run_python", {"code": "print(await mcp_fixture.add(a=1, b=2))",
                                                    "servers": ["fixture"]})  # fmt: skip
        assert data(allowed)["status"] == "success" and "3" in data(allowed)["stdout"]
        live.config.write_text(config_text(bob=True, deny=["add"]))
        (live.state.parent / "token").write_text(NEW_FILE_TOKEN)
        log_before = len(_audit_or_empty(live))
        live.process.send_signal(signal.SIGHUP)

        async def bob_accepted() -> bool:
            return await upload_status(BOB) == 201

        await until(bob_accepted)
        assert await upload_status(NEW_FILE_TOKEN) == 201
        assert await upload_status(FILE_TOKEN) == 401
        again = await call(client, "run_python", {"code": "print(kept + 1)", "conversationId": "s"})
        assert data(again)["stdout"].strip() == "42" and data(again)["session"] == "kept"
        denied = await call(client, "run_python", {"code": "print(await mcp_fixture.add(a=1, b=2))",
                                                   "servers": ["fixture"]})  # fmt: skip
        assert data(denied)["status"] == "error"
        calls = [line for line in live.audit()[log_before:] if line["event"] == "tool_call"]
        assert calls == [] or all(line["outcome"] == "denied" for line in calls)


_FORKS = """
import os, time
children = []
try:
    while len(children) < 200:
        child = os.fork()
        if child == 0:
            time.sleep(30)
            os._exit(0)
        children.append(child)
except OSError:
    pass
for child in children:
    os.kill(child, 9)
print(len(children))
"""


async def test_memory_and_pids_limits_show_as_limit_events(state_dir: Path, sandbox_runtime: Path | None) -> None:
    env = {"MCP_SANDBOX_MEMORY": "128m", "MCP_SANDBOX_PIDS": "16", "MCP_SANDBOX_POOL_SIZE": "0",
           "MCP_SANDBOX_POOL_MIN": "0"}  # fmt: skip
    async with (
        server(state_dir, sandbox_runtime, **env) as live,
        http_client(live.base, ALICE) as client,
        httpx2.AsyncClient(timeout=CALL_BOUND) as web,
    ):
        hog = data(await call(client, "run_python", {"code": "hog = b'1' * (1 << 30)\nprint(len(hog))"}))
        forks = data(await call(client, "run_python", {"code": _FORKS}))
        assert hog["status"] == "error" and forks["status"] == "error", (hog, forks)
        # Where the host enforces the limit with a cgroup, the engine says so and counts it, and so
        # where RLIMIT_AS stands in (the run's MemoryError); where RLIMIT_NPROC stands in (EAGAIN), no
        # pids event is claimed. Either way they agree.
        memory_said = "memory limit" in (hog.get("error") or "")
        assert memory_said, hog
        pids_said = "process limit" in (forks.get("error") or "")
        assert await metric(web, live.base, "mcp_sandbox_limit_events_total", limit="memory") == float(memory_said)
        assert await metric(web, live.base, "mcp_sandbox_limit_events_total", limit="pids") == float(pids_said)
        # Failures by cause name the limit (a plain error where RLIMIT_NPROC stood in for pids).
        memory_cause = {"cause": "memory_limit", "tenant": "alice"}
        assert await metric_sum(web, live.base, "mcp_sandbox_run_failures_total", **memory_cause) >= 1
        pids_cause = {"cause": "pids_limit" if pids_said else "error", "tenant": "alice"}
        assert await metric_sum(web, live.base, "mcp_sandbox_run_failures_total", **pids_cause) >= 1
        runs = [line for line in live.audit() if line["event"] == "run"]
        assert [line["limits"] for line in runs] == [["memory"], ["pids"] if pids_said else []]


def exported(text: str) -> set[str]:
    """The sample names a scrape can hold, from its ``# TYPE`` lines (a counter with no sample yet too)."""
    names: set[str] = set()
    for name, kind in re.findall(r"^# TYPE (\S+) (\S+)$", text, flags=re.MULTILINE):
        suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_count", "_sum")}.get(kind, ("",))
        names |= {name.removesuffix("_total") + suffix for suffix in suffixes}
    return names


async def test_metrics_answer_the_operators_questions_and_the_dashboard_reads_only_them(live: Server) -> None:
    """A warm, a session and a TypeScript run and a failing downstream call, each seen with its labels."""
    base = live.base
    async with httpx2.AsyncClient(timeout=CALL_BOUND) as web:

        async def ready() -> bool:
            return (await web.get(f"{base}/readyz")).status_code == 200

        await until(ready, 60)
        assert await metric(web, base, "mcp_sandbox_ready") == 1
        async with http_client(base, ALICE) as client:
            warm = await call(client, "run_python", {"code": "print(1)"})
            assert data(warm)["status"] == "success", data(warm)
            session = await call(client, "run_python", {"code": "x = 1", "conversationId": CONVERSATION})
            assert data(session)["status"] == "success", data(session)
            ts = await call(client, "run_code", {"code": "console.log(1 + 1)", "language": "typescript"})
            assert data(ts)["status"] == "success", data(ts)
            code = "try:\n    await mcp_fixture.fail(message='no')\nexcept mcp.runtime.MCPError:\n    print('failed')"
            failing = await call(client, "run_python", {"code": code, "servers": ["fixture"]})
            assert data(failing)["stdout"].strip() == "failed", data(failing)

        count = "mcp_sandbox_run_duration_seconds_count"
        assert await metric_sum(web, base, count, language="python", path="warm") >= 1
        assert await metric_sum(web, base, count, language="python", path="session") == 1
        assert await metric_sum(web, base, count, language="typescript") == 1
        # Warm runs take milliseconds: the first buckets resolve them.
        fast = await metric_sum(web, base, "mcp_sandbox_run_duration_seconds_bucket", path="warm", le="0.005")
        assert 0 <= fast <= await metric_sum(web, base, count, path="warm")
        assert await metric_sum(web, base, "mcp_sandbox_runs_total", tenant="alice", status="success") == 4
        assert await metric(web, base, "mcp_sandbox_tool_calls_total", server="fixture", outcome="tool_error") == 1
        assert await metric(web, base, "mcp_sandbox_pool_starts_total", pool="warm", language="python") >= 1
        starts = await metric(web, base, "mcp_sandbox_pool_starts_total", pool="prestarted", language="typescript")
        assert starts >= 1
        text = await scrape(web, base)
        assert "_created" not in text
        missing = dashboard_metrics() - exported(text)
        assert not missing, f"the dashboard reads metrics the server does not export: {sorted(missing)}"
        alerts = set(re.findall(r"\bmcp_sandbox_[a-z_]+", ALERTS.read_text()))
        assert not alerts - exported(text), sorted(alerts - exported(text))
