"""A long run as a task through the MCP Inspector CLI.

The Inspector (`@modelcontextprotocol/inspector --cli`, installed by `make conformance-tools`)
calls a tool in the 2026-07-28 era through the tasks extension's client: the server answers a
call still running after ``task_after`` (1 s here) with a task, and the client polls
``tasks/get`` to the end. The call completes with the run's output, and the operator's
``mcp-sandbox tasks`` shows it ran as a task. The CLI's request timeout is the TypeScript SDK's
60 s, which it does not let a user lower (it ignores a session file's ``requestTimeout``), so
a run that outlives it is left to bench/long_tasks.py (90 s and 10 minutes).
"""

from __future__ import annotations

import json
import os
import uuid
from pathlib import Path
from typing import Any

import anyio
import pytest

from mcp_test_helpers import CALL_BOUND, INSPECTOR_JS, auth_tokens, conformance_node, http_server, mcp_sandbox_cli

pytestmark = [pytest.mark.e2e, pytest.mark.anyio]

TOKEN = "inspector-task-token-0123456789ab"
CODE = "import time; time.sleep(3); print('outlived task_after')"


async def inspect(node: Path, home: Path, url: str) -> tuple[int, Any, str]:
    """One CLI ``tools/call`` of run_python in the 2026-07-28 era; its exit code, its JSON result
    (when it succeeded) and its stderr."""
    command = [
        str(node),
        str(INSPECTOR_JS),
        "--cli",
        "--server-url",
        f"{url}/mcp",
        "--protocol-era",
        "modern",
        "--format",
        "json",
        "--stored-auth-only",
        "--header",
        f"Authorization: Bearer {TOKEN}",
        "--method",
        "tools/call",
        "--tool-name",
        "run_python",
        "--tool-args-json",
        json.dumps({"code": CODE}),
    ]
    # Its catalog, client config and OAuth store live under HOME: a throwaway one.
    env = {"HOME": str(home), "PATH": os.environ.get("PATH", os.defpath)}
    run = await anyio.run_process(command, check=False, env=env, cwd=home)
    result = json.loads(run.stdout)["result"] if run.returncode == 0 else None
    return run.returncode, result, run.stderr.decode(errors="replace")


async def test_the_inspectors_call_of_a_run_longer_than_task_after_completes_as_a_task(
    state_dir: Path, sandbox_runtime: Path | None, tmp_path: Path
) -> None:
    node = conformance_node()
    config = state_dir.parent / f"inspector-{uuid.uuid4().hex[:8]}.toml"
    config.write_text(auth_tokens({"default": TOKEN}))
    env = {"MCP_SANDBOX_TASK_AFTER": "1"}
    with anyio.fail_after(CALL_BOUND * 2):
        async with http_server(state_dir, "--config", str(config), env=env, runtime=sandbox_runtime) as url:
            returncode, result, stderr = await inspect(node, tmp_path, url)
            listed = await anyio.to_thread.run_sync(
                lambda: mcp_sandbox_cli("tasks", "--json", state_dir=state_dir, runtime=sandbox_runtime)
            )

    assert returncode == 0, stderr
    assert result["isError"] is False
    assert result["structuredContent"]["stdout"] == "outlived task_after\n"
    assert listed.returncode == 0, listed.stderr
    tasks = [json.loads(line) for line in listed.stdout.splitlines()]
    assert [task["status"] for task in tasks] == ["completed"]  # the one call, run as a task
