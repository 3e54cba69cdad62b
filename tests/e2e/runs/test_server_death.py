"""A server killed outright (SIGKILL: no clean-up of its own) takes its running sandboxes with it.

The kernel does it: bwrap's ``--die-with-parent`` asks for SIGKILL when the server dies, and the
sandbox's pid namespace dies with bwrap's init. Driven over raw stdio pipes, a run is left
sleeping with a marked process of its own, the server is killed, and the process must go.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import uuid
from pathlib import Path
from typing import Any

import anyio
import pytest

from mcp_test_helpers import _server_env, host_processes, poll

pytestmark = [pytest.mark.e2e, pytest.mark.anyio]

BOUND = 30.0


def _message(request_id: int | None, method: str, params: dict[str, Any]) -> bytes:
    body: dict[str, Any] = {"jsonrpc": "2.0", "method": method, "params": params}
    if request_id is not None:
        body["id"] = request_id
    return json.dumps(body).encode() + b"\n"


@pytest.mark.parametrize("pool", ["0", "2"], ids=["fresh", "warm"])
async def test_a_killed_server_takes_its_running_sandbox_with_it(state_dir: Path, pool: str) -> None:
    marker = f"server-death-{uuid.uuid4().hex}"
    code = f"import subprocess, time\nsubprocess.Popen([{marker!r}, '300'], executable='/bin/sleep')\ntime.sleep(300)\n"
    env = _server_env(None, {"MCP_SANDBOX_POOL_SIZE": pool, "MCP_SANDBOX_POOL_MIN": pool})
    server = await anyio.open_process(
        [sys.executable, "-m", "mcp_sandbox", "serve", "--state-dir", str(state_dir)], env=env, stderr=None
    )
    try:
        assert server.stdin is not None
        init = {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}}
        await server.stdin.send(_message(1, "initialize", init))
        await server.stdin.send(_message(None, "notifications/initialized", {}))
        call = {"name": "run_python", "arguments": {"code": code, "timeout": 120}}
        await server.stdin.send(_message(2, "tools/call", call))
        with anyio.fail_after(BOUND):
            await poll(lambda: bool(host_processes(marker)))
        server.send_signal(signal.SIGKILL)
        with anyio.fail_after(BOUND):
            await server.wait()
        with anyio.move_on_after(BOUND):
            await poll(lambda: not host_processes(marker))
        assert host_processes(marker) == []
    finally:
        if server.returncode is None:
            server.kill()
            await server.wait()
        for pid in host_processes(marker):
            os.kill(pid, signal.SIGKILL)
