"""TypeScript and JavaScript end to end over MCP: run_code, code mode with typed results, files, list_runners.

The MCP client is the SDK's, talking to our server in process; the downstream servers are the
real ones `make downstream` installs (npm everything, PyPI time) plus our fixture server; every
run is a real bwrap sandbox on the configured JavaScript runtime, once for each installed one.
"""

from __future__ import annotations

import os
import textwrap
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client

from downstream import make_git_repo, require_installed, servers_config, write_servers_config
from mcp_sandbox import load_settings
from mcp_sandbox.config import JS_RUNTIMES
from mcp_sandbox.engine.runtimes import js_binary
from mcp_test_helpers import CALL_BOUND, memory_client, structured

pytestmark = [pytest.mark.e2e, pytest.mark.anyio]


@pytest.fixture(scope="module", params=JS_RUNTIMES)
def js_runtime(request: pytest.FixtureRequest) -> str:
    runtime: str = request.param
    binary = js_binary(load_settings(env={}, flags={}).paths, runtime)
    if not os.access(binary, os.X_OK):
        pytest.skip(f"{runtime} is not installed at {binary}: run `make runtime`")
    return runtime


@pytest.fixture(scope="module")
async def client(module_state_dir: Path, sandbox_runtime: Path | None, js_runtime: str) -> AsyncIterator[Client]:
    require_installed()
    directory = module_state_dir.parent / f"downstream-{js_runtime}"
    directory.mkdir(parents=True)
    config = servers_config(
        directory, git_repo=make_git_repo(directory / "repo"), include=("time", "everything", "fixture")
    )
    write_servers_config(directory / "servers.json", config)
    async with memory_client(
        module_state_dir / js_runtime,
        sandbox_runtime,
        read_timeout=None,
        servers_config=str(directory / "servers.json"),
        js_runtime=js_runtime,
    ) as client:
        yield client


async def run_code(client: Client, code: str, language: str = "typescript", **extra: Any) -> dict[str, Any]:
    with anyio.fail_after(CALL_BOUND):
        result = await client.call_tool("run_code", {"code": textwrap.dedent(code), "language": language, **extra})
    data = structured(result)
    assert result.is_error == (data["status"] != "success")
    return data


async def test_typescript_and_javascript_run_over_mcp(client: Client) -> None:
    ts = await run_code(client, "const n: number = 6 * 7; console.log(`answer ${n}`);")
    js = await run_code(client, "console.log([1, 2, 3].map((x) => x * 2).join(','));", "javascript")
    assert (ts["status"], ts["exitCode"], ts["stdout"]) == ("success", 0, "answer 42\n")
    assert (js["status"], js["stdout"]) == ("success", "2,4,6\n")


async def test_errors_exit_codes_timeouts_and_huge_output_come_back_as_results(client: Client) -> None:
    thrown = await run_code(client, "\nthrow new RangeError('out of range');")
    exited = await run_code(client, "process.exit(5);", "javascript")
    timed = await run_code(client, "while (true) {}", "javascript", timeout=2)
    huge = await run_code(client, "for (let i = 0; i < 3000; i++) console.log('z'.repeat(1000));")
    assert (thrown["status"], thrown["exitCode"]) == ("error", 1)
    assert "RangeError: out of range" in thrown["stderr"] and "main.ts:2:" in thrown["stderr"]
    assert (exited["status"], exited["exitCode"]) == ("error", 5)
    assert (timed["status"], timed["exitCode"]) == ("timeout", 124)
    assert huge["status"] == "success" and huge["truncated"] is True


async def test_a_typescript_script_chains_tools_of_two_servers_with_typed_results(client: Client) -> None:
    data = await run_code(
        client,
        """
        import type { GetCurrentTimeResult } from "/tools/time/index.d.ts";
        import { readFileSync } from "node:fs";

        const now: GetCurrentTimeResult = await mcp.servers.time.get_current_time({ timezone: "Europe/Paris" });
        const [sum, echoed] = await Promise.all([
          mcp.servers.everything["get-sum"]({ a: 40, b: 2 }),
          mcp.servers.everything.echo({ message: now.timezone }),
        ]);
        const typings = readFileSync("/tools/time/index.d.ts", "utf8");
        console.log(now.timezone, typeof now.is_dst, JSON.stringify(sum), JSON.stringify(echoed));
        console.log(typings.includes("export interface Server"), typings.includes('"get_current_time"('));
        """,
        servers=["time", "everything"],
    )
    assert data["status"] == "success", data
    first, second = data["stdout"].splitlines()
    assert first.startswith("Europe/Paris boolean ")
    assert "42" in first and "Europe/Paris" in first.split(" ", 2)[2]
    assert second == "true true"


async def test_a_failing_or_denied_tool_call_rejects_with_mcp_error(client: Client) -> None:
    data = await run_code(
        client,
        """
        for (const call of [
          () => mcp.servers.time.get_current_time({ timezone: "Not/AZone" }),
          () => mcp.runtime.callTool("fixture", "add", { a: 1, b: 2 }),
          () => mcp.servers.fixture.add({ a: 1, b: 2 }),
        ]) {
          try { await call(); console.log("no error"); }
          catch (error) { console.log(error instanceof mcp.MCPError, (error as any).kind); }
        }
        const servers = await mcp.runtime.listServers();
        console.log(servers.map((s) => s.alias).join(","));
        """,
        servers=["time"],
    )
    assert data["status"] == "success", data
    assert data["stdout"].splitlines() == ["true tool", "true denied", "true denied", "time"]


async def test_a_request_over_max_call_bytes_rejects_with_mcp_error_and_the_run_goes_on(client: Client) -> None:
    # The host ends a run whose CALL frame passes max_call_bytes (1 MiB by default): the runner fails it first.
    data = await run_code(
        client,
        """
        try { await mcp.servers.fixture.echo({ text: "x".repeat(2 << 20) }); console.log("no error"); }
        catch (error) { console.log(error instanceof mcp.MCPError, (error as any).kind); }
        console.log(await mcp.servers.fixture.echo({ text: "small" }));
        """,
        servers=["fixture"],
    )
    assert data["status"] == "success", data
    assert data["stdout"].splitlines() == ["true invalid", "small"]


async def test_a_conversations_files_are_written_and_listed(client: Client) -> None:
    data = await run_code(
        client,
        """
        import { writeFileSync } from "node:fs";
        writeFileSync("/workspace/report.txt", "hello from TypeScript");
        console.log(process.env.FILE_BASE_URL === undefined ? "no url" : "url");
        """,
        conversationId="js-files",
    )
    assert data["status"] == "success", data
    assert [(entry["name"], entry["size"]) for entry in data["files"]] == [("report.txt", 21)]
    again = await run_code(
        client,
        "import { readFileSync } from 'node:fs';\nconsole.log(readFileSync('/workspace/report.txt', 'utf8'));",
        "javascript",
        conversationId="js-files",
    )
    assert (again["status"], again["stdout"]) == ("success", "hello from TypeScript\n")


async def test_list_runners_reports_typescript_and_javascript_with_the_runtime(client: Client, js_runtime: str) -> None:
    with anyio.fail_after(CALL_BOUND):
        result = await client.call_tool("list_runners", {})
    runners = {runner["language"]: runner for runner in structured(result)["runners"]}
    assert {"python", "typescript", "javascript"} <= set(runners)
    for language in ("typescript", "javascript"):
        assert runners[language]["runtime"] == js_runtime
        assert runners[language]["version"] and runners[language]["version"][0].isdigit()
        assert "error" not in runners[language]


async def test_fifty_concurrent_calls_and_a_large_result_arrive(client: Client) -> None:
    # `rendezvous` only returns once 50 calls are in flight at the same moment.
    data = await run_code(
        client,
        """
        const peaks = await Promise.all(
          Array.from({ length: 50 }, () => mcp.servers.fixture.rendezvous({ parties: 50, seconds: 60 })),
        );
        const text = (await mcp.servers.fixture.big({ mebibytes: 8 })) as string;
        console.log(Math.min(...peaks.map((peak: any) => peak.result)), peaks.length, text.length, new Set(text).size);
        """,
        servers=["fixture"],
    )
    assert data["status"] == "success", data
    assert data["stdout"].split() == ["50", "50", str(8 << 20), "1"]
