"""A downstream server that breaks its stdio framing fails that call, and only that call.

Issue 34, finding 3: one line of invalid UTF-8, or one line of tens of megabytes, from a stdio
server made every later call to it time out, and it was never restarted. Here sandboxed code
(a real bwrap run) calls the fixture server's `garble` tool, which writes such a line onto its
own protocol stream; the call must fail at once with an error naming the server and the fault,
the next call to that server must reach a restarted server, and another server must not notice.
"""

from __future__ import annotations

import json
import sys
import textwrap
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client

from downstream import FIXTURE_SERVER
from mcp_test_helpers import memory_client, run_python, structured

pytestmark = [pytest.mark.e2e, pytest.mark.anyio]

# A message cap well under the 50 MiB line the fixture writes, so the test stays small in memory.
RESULT_CAP = 8 << 20
# A broken call must fail long before the tool timeout (60 s) that used to run out.
BOUND = 30.0


@pytest.fixture(scope="module")
async def client(module_state_dir: Path, sandbox_runtime: Path | None) -> AsyncIterator[Client]:
    fixture = {"command": sys.executable, "args": [str(FIXTURE_SERVER)]}
    config = module_state_dir.parent / "framing-servers.json"
    config.write_text(json.dumps({"mcpServers": {"fixture": fixture, "steady": fixture}}))
    async with memory_client(
        module_state_dir,
        sandbox_runtime,
        read_timeout=None,
        servers_config=str(config),
        max_tool_result_bytes=RESULT_CAP,
    ) as client:
        yield client


async def run(client: Client, code: str) -> str:
    result = await run_python(client, {"code": textwrap.dedent(code), "servers": ["fixture", "steady"]}, bound=120)
    data: dict[str, Any] = structured(result)
    assert data["status"] == "success", data
    stdout: str = data["stdout"]
    return stdout


@pytest.mark.parametrize(
    ("kind", "fault"),
    [("invalid-utf8", "not valid UTF-8"), ("huge-line", f"over {RESULT_CAP} bytes")],
)
async def test_a_server_that_breaks_its_framing_fails_that_call_and_is_restarted_for_the_next(
    client: Client, kind: str, fault: str
) -> None:
    before = await run(client, "print((await mcp_fixture.pid())['result'], (await mcp_steady.pid())['result'])")
    fixture_pid, steady_pid = before.split()
    with anyio.fail_after(BOUND):
        broken = await run(
            client,
            f"""
            import time
            started = time.monotonic()
            try:
                await mcp_fixture.garble(kind={kind!r}, mebibytes=50)
            except mcp.runtime.MCPError as error:
                print(error.kind, error.server, "|", error.message, "|", round(time.monotonic() - started))
            print((await mcp_steady.pid())["result"])
            """,
        )
    failure, steady_after = broken.splitlines()
    kind_and_server, message, _seconds = failure.split(" | ")
    assert kind_and_server == "unavailable fixture"
    assert "server 'fixture' broke the protocol" in message and fault in message
    assert steady_after == steady_pid  # the other server's connection was never touched
    with anyio.fail_after(BOUND):
        after = await run(client, "print((await mcp_fixture.pid())['result'], await mcp_fixture.echo(text='back'))")
    restarted_pid, echoed = after.split()
    assert restarted_pid != fixture_pid and echoed == "back"
