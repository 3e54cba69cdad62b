"""Progress notifications while a run lasts, through the SDK's client over real stdio and real HTTP.

A call that carries a progress token gets ``notifications/progress`` with each printed line as
the message, before the result; a call without one gets none.
"""

from __future__ import annotations

import contextlib
import textwrap
import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client

from mcp_test_helpers import CALL_BOUND, http_client, http_server, stdio_client, structured

pytestmark = [pytest.mark.e2e, pytest.mark.anyio]

TOKEN = "progress-e2e-token-0123456789abcdef"
LINES = 5


@contextlib.asynccontextmanager
async def _stdio(state_dir: Path, runtime: Path | None) -> AsyncIterator[Client]:
    async with stdio_client(state_dir, runtime) as client:
        yield client


@contextlib.asynccontextmanager
async def _http(state_dir: Path, runtime: Path | None) -> AsyncIterator[Client]:
    async with (
        http_server(state_dir, env={"MCP_SANDBOX_TOKEN": TOKEN}, runtime=runtime) as base_url,
        http_client(base_url, TOKEN) as client,
    ):
        yield client


TRANSPORTS: dict[str, Callable[[Path, Path | None], contextlib.AbstractAsyncContextManager[Client]]] = {
    "http": _http,
    "stdio": _stdio,
}


@pytest.fixture(scope="module", params=sorted(TRANSPORTS))
async def client(
    request: pytest.FixtureRequest, module_state_dir: Path, sandbox_runtime: Path | None
) -> AsyncIterator[Client]:
    async with TRANSPORTS[request.param](module_state_dir, sandbox_runtime) as client:
        yield client


PYTHON = textwrap.dedent(f"""
    import sys, time
    for i in range({LINES}):
        print(f"line {{i}}", flush=True)
        time.sleep(0.4)
    print("to stderr", file=sys.stderr, flush=True)
    print("no newline at the end", end="")
""")
TYPESCRIPT = textwrap.dedent(f"""
    for (let i = 0; i < {LINES}; i++) {{
      console.log(`line ${{i}}`);
      await new Promise((done) => setTimeout(done, 400));
    }}
    console.error("to stderr");
    process.stdout.write("no newline at the end");
""")


class Seen:
    """The progress notifications of one call, and whether the call had returned when each came."""

    def __init__(self) -> None:
        self.events: list[tuple[float, str | None]] = []
        self.finished = False
        self.late = 0

    async def __call__(self, progress: float, total: float | None, message: str | None) -> None:
        if self.finished:
            self.late += 1
        self.events.append((progress, message))


async def _call(client: Client, tool: str, arguments: dict[str, Any], seen: Seen | None) -> dict[str, Any]:
    with anyio.fail_after(CALL_BOUND):
        result = await client.call_tool(tool, arguments, progress_callback=seen)
    if seen is not None:
        seen.finished = True
    data = structured(result)
    assert data["status"] == "success", data
    return data


@pytest.mark.parametrize(
    ("tool", "arguments"),
    [
        ("run_python", {"code": PYTHON}),
        ("run_python", {"code": PYTHON, "conversationId": f"progress-{uuid.uuid4().hex[:8]}"}),
        ("run_code", {"code": TYPESCRIPT, "language": "typescript"}),
    ],
    ids=["python-fresh", "python-session", "typescript"],
)
async def test_a_run_reports_each_printed_line_as_progress_while_it_lasts(
    client: Client, tool: str, arguments: dict[str, Any]
) -> None:
    seen = Seen()

    await _call(client, tool, arguments, seen)

    messages = [message for _, message in seen.events]
    assert messages == [*(f"line {i}" for i in range(LINES)), "to stderr", "no newline at the end"]
    progress = [value for value, _ in seen.events]
    assert progress == sorted(progress) and len(set(progress)) == len(progress)
    assert seen.late == 0


async def test_progress_arrives_while_the_run_still_runs(client: Client) -> None:
    # The code waits for a file the test uploads only once it has heard the first line: the run
    # can only finish if that line came as progress while it ran.
    conversation = f"progress-{uuid.uuid4().hex[:8]}"
    code = textwrap.dedent("""
        import os, time
        print("waiting", flush=True)
        while not os.path.exists("/workspace/go"):
            time.sleep(0.05)
        print("done")
    """)
    first = anyio.Event()

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        if message == "waiting":
            first.set()

    results: list[dict[str, Any]] = []

    async def run() -> None:
        result = await client.call_tool(
            "run_python", {"code": code, "conversationId": conversation}, progress_callback=on_progress
        )
        results.append(structured(result))

    with anyio.fail_after(CALL_BOUND):
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(run)
            await first.wait()
            upload = {"conversationId": conversation, "filename": "go", "content": "MQ=="}
            assert not (await client.call_tool("upload_file", upload)).is_error
    assert results[0]["status"] == "success"
    assert results[0]["stdout"] == "waiting\ndone\n"
