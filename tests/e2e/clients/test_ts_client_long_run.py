"""A run longer than 60 s through the MCP TypeScript SDK's own client, with its default timeout.

The SDK (`@modelcontextprotocol/sdk`, as `make downstream` installs it in downstream/node_modules)
gives up on a request after DEFAULT_REQUEST_TIMEOUT_MSEC (60 s) unless progress resets the timer.
ts_long_run.mjs starts our server over stdio and calls run_python twice at once with code that
prints a line every 5 s for 65 s: with `onprogress` and `resetTimeoutOnProgress: true` the call
completes with every line; the same call without them (the control) fails with the SDK's
RequestTimeout at 60 s. Both calls run side by side, so the test lasts one run (~70 s).
"""

from __future__ import annotations

import json
import os
import shutil
import textwrap
from pathlib import Path
from typing import Any

import anyio
import pytest

from downstream import require_installed
from mcp_test_helpers import stdio_server_entry

pytestmark = [pytest.mark.e2e, pytest.mark.anyio]

REPO_ROOT = Path(__file__).resolve().parents[3]
SCRIPT = Path(__file__).with_name("ts_long_run.mjs")
NODE_MODULES = REPO_ROOT / "downstream" / "node_modules"

LINES = 14  # line 0 at once, then one every 5 s: the last at 65 s
INTERVAL = 5
CODE = textwrap.dedent(f"""
    import time
    for i in range({LINES}):
        if i:
            time.sleep({INTERVAL})
        print(f"line {{i}}", flush=True)
""")
RUN_TIMEOUT = 100  # the run's own limit (seconds), above the 65 s it lasts, within max_timeout
# The SDK's ErrorCode.RequestTimeout.
REQUEST_TIMEOUT = -32001
# The whole script: start node and the server, two calls side by side, close.
SCRIPT_BOUND = 180.0


def _node() -> str:
    node = shutil.which("node")
    assert node is not None  # require_installed checked it
    return node


async def _run_script(tmp_path: Path, state_dir: Path, runtime: Path | None) -> dict[str, Any]:
    # A copy beside a node_modules link, so the script imports the SDK by its package name as a
    # user's client does (node resolves from the script's real path, so a link to it would not do).
    work = tmp_path / "client"
    work.mkdir()
    (work / "node_modules").symlink_to(NODE_MODULES)
    script = work / SCRIPT.name
    shutil.copyfile(SCRIPT, script)
    request = {
        **stdio_server_entry(state_dir, runtime, {"MCP_SANDBOX_DISCOVER_SERVERS": "false"}),
        "code": CODE,
        "timeout": RUN_TIMEOUT,
    }
    env = {name: value for name, value in os.environ.items() if not name.startswith(("MCP_SANDBOX_", "MCP_BRIDGE_"))}
    with anyio.fail_after(SCRIPT_BOUND):
        done = await anyio.run_process([_node(), str(script), json.dumps(request)], env=env, check=False)
    assert done.returncode == 0, done.stderr.decode(errors="replace")[-4000:]
    output: dict[str, Any] = json.loads(done.stdout)
    return output


async def test_the_ts_sdk_client_waits_past_its_default_timeout_while_a_run_reports_progress(
    tmp_path: Path, state_dir: Path, sandbox_runtime: Path | None
) -> None:
    require_installed()

    output = await _run_script(tmp_path, state_dir, sandbox_runtime)

    default_ms = output["defaultTimeoutMs"]
    assert default_ms == 60_000
    progress, control = output["progress"], output["control"]
    # With onprogress and resetTimeoutOnProgress: the whole run, well past the default timeout.
    assert progress["ok"], progress
    data = progress["result"]["structuredContent"]
    assert data["status"] == "success", data
    assert data["stdout"] == "".join(f"line {i}\n" for i in range(LINES))
    assert progress["elapsedMs"] > default_ms
    assert [event["message"] for event in progress["progress"]] == [f"line {i}" for i in range(LINES)]
    # Without them, the same call: the SDK's own timeout once its default has passed.
    assert not control["ok"], control
    assert control["error"]["code"] == REQUEST_TIMEOUT, control
    assert control["elapsedMs"] >= default_ms
    assert control["progress"] == []
