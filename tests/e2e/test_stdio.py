"""The real server over real stdio: `python -m mcp_sandbox serve` driven by the SDK's Client."""

from __future__ import annotations

import importlib.util
import json
import os
import sys
import textwrap
import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client, StdioServerParameters
from mcp.types import CallToolResult, TextContent

pytestmark = [pytest.mark.e2e, pytest.mark.anyio]

# Generous bounds: the machines are small and may be busy; every wait below is bounded by one.
CONNECT_BOUND = 60.0
CALL_BOUND = 60.0
RESULT_KEYS = {"status", "exitCode", "stdout", "stderr", "durationMs", "truncated"}


def _child_pythonpath() -> str | None:
    """The PYTHONPATH the server process needs to import the package this test imported.

    The stdio client passes the child only HOME, PATH and a few more variables, so a PYTHONPATH
    that makes the package importable here is not inherited; an installed package needs none.
    """
    spec = importlib.util.find_spec("mcp_sandbox")
    assert spec is not None and spec.origin is not None
    source_root = Path(spec.origin).resolve().parents[1]
    on_pythonpath = {Path(p).resolve() for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p}
    return str(source_root) if source_root in on_pythonpath else None


def _server(state_dir: Path, runtime: Path | None) -> Client:
    env: dict[str, str] = {}
    if (pythonpath := _child_pythonpath()) is not None:
        env["PYTHONPATH"] = pythonpath
    if runtime is not None:
        env["MCP_SANDBOX_PYTHON_RUNTIME"] = str(runtime)
    params = StdioServerParameters(
        command=sys.executable,
        args=["-m", "mcp_sandbox", "serve", "--state-dir", str(state_dir)],
        env=env,
    )
    # read_timeout_seconds bounds every request, the connection handshake included.
    return Client(params, read_timeout_seconds=CONNECT_BOUND)


@pytest.fixture(scope="module")
async def client(module_state_dir: Path, sandbox_runtime: Path | None) -> AsyncIterator[Client]:
    async with _server(module_state_dir, sandbox_runtime) as client:
        yield client


async def _run(client: Client, arguments: dict[str, Any], bound: float = CALL_BOUND) -> CallToolResult:
    with anyio.fail_after(bound):
        return await client.call_tool("run_python", arguments)


def _structured(result: CallToolResult) -> dict[str, Any]:
    data: dict[str, Any] | None = result.structured_content
    assert data is not None
    return data


def _text(result: CallToolResult) -> str:
    assert len(result.content) == 1
    block = result.content[0]
    assert isinstance(block, TextContent)
    return block.text


def _pids_with(marker: str) -> list[int]:
    """Host processes whose command line carries ``marker``."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:  # the process exited while we looked
            continue
        if marker.encode() in cmdline:
            found.append(int(entry.name))
    return found


async def _poll(condition: Callable[[], bool]) -> None:
    """Poll ``condition`` until it holds; the caller bounds the wait with anyio.fail_after."""
    while not condition():  # noqa: ASYNC110 - /proc has no event to wait on
        await anyio.sleep(0.05)


async def test_tools_list_shows_run_python_with_an_output_schema_and_code_required(client: Client) -> None:
    with anyio.fail_after(CALL_BOUND):
        listing = await client.list_tools()

    tools = {tool.name: tool for tool in listing.tools}
    assert "run_python" in tools
    tool = tools["run_python"]
    assert tool.input_schema["required"] == ["code"]
    assert set(tool.input_schema["properties"]) >= {"code", "servers", "timeout"}
    assert tool.output_schema is not None
    assert set(tool.output_schema["required"]) >= RESULT_KEYS


async def test_printing_code_succeeds_with_its_stdout(client: Client) -> None:
    result = await _run(client, {"code": "print(2 + 2)"})

    data = _structured(result)
    assert result.is_error is False
    assert set(data) >= RESULT_KEYS
    assert data["status"] == "success"
    assert data["exitCode"] == 0
    assert data["stdout"] == "4\n"
    assert data["stderr"] == ""
    assert data["truncated"] is False
    assert isinstance(data["durationMs"], int)
    assert _text(result).strip() == "4"


async def test_an_uncaught_exception_is_an_error_whose_traceback_shows_the_users_line(client: Client) -> None:
    result = await _run(client, {"code": "x = 1\nraise ValueError('boom')\n"})

    data = _structured(result)
    assert result.is_error is True
    assert data["status"] == "error"
    assert data["exitCode"] == 1
    assert "line 2" in data["stderr"]
    assert "raise ValueError('boom')" in data["stderr"]
    assert "ValueError: boom" in data["stderr"]
    for runner_file in ("runner.py", "boot.py", "mcp_sandbox_runtime"):
        assert runner_file not in data["stderr"]


async def test_sys_exit_with_a_code_is_an_error_with_that_exit_code(client: Client) -> None:
    result = await _run(client, {"code": "import sys\nsys.exit(3)"})

    data = _structured(result)
    assert result.is_error is True
    assert data["status"] == "error"
    assert data["exitCode"] == 3


async def test_code_running_past_its_timeout_is_stopped_with_status_timeout(client: Client) -> None:
    result = await _run(client, {"code": "while True:\n    pass", "timeout": 1}, bound=15)

    data = _structured(result)
    assert result.is_error is True
    assert data["status"] == "timeout"
    assert data["durationMs"] >= 1000


async def test_huge_output_is_truncated_and_says_so(client: Client) -> None:
    code = "import sys\nsys.stdout.write('BEGIN' + 'x' * (20 << 20))"
    result = await _run(client, {"code": code})

    data = _structured(result)
    assert data["status"] == "success"
    assert data["truncated"] is True
    assert data["stdout"].startswith("BEGIN")
    assert "truncated" in data["stdout"][-200:]
    assert len(data["stdout"]) < 4 << 20
    assert len(_text(result)) < 4 << 20


async def test_output_that_is_not_utf8_is_decoded_with_replacement_characters(client: Client) -> None:
    result = await _run(client, {"code": "import sys\nsys.stdout.buffer.write(b'\\xff\\xfe ok\\n')"})

    data = _structured(result)
    assert data["status"] == "success"
    assert "\ufffd" in data["stdout"]
    assert data["stdout"].endswith(" ok\n")


async def test_pandas_groupby_runs_in_the_sandbox(client: Client, packaged_runtime: Path) -> None:
    code = textwrap.dedent(
        """
        import numpy as np
        import pandas as pd
        frame = pd.DataFrame({"k": ["a", "b", "a", "b"], "v": np.arange(4)})
        for key, total in frame.groupby("k")["v"].sum().items():
            print(key, total)
        """
    )
    result = await _run(client, {"code": code})

    data = _structured(result)
    assert data["status"] == "success", data
    assert data["stdout"].split("\n") == ["a 2", "b 4", ""]


async def test_matplotlib_with_agg_saves_a_png_into_the_workspace(client: Client, packaged_runtime: Path) -> None:
    code = textwrap.dedent(
        """
        import os
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        plt.plot([1, 2, 3], [1, 4, 9])
        plt.savefig("/workspace/plot.png")
        with open("/workspace/plot.png", "rb") as image:
            print(image.read(8) == b"\\x89PNG\\r\\n\\x1a\\n", os.path.getsize("/workspace/plot.png") > 1000)
        """
    )
    result = await _run(client, {"code": code})

    data = _structured(result)
    assert data["status"] == "success", data
    assert data["stdout"] == "True True\n"


VALIDATION_CASES: list[tuple[dict[str, Any], str]] = [
    ({}, "code"),
    ({"code": ""}, "code"),
    ({"code": 42}, "code"),
    ({"code": "print(1)", "timeout": 10_000}, "timeout"),
    ({"code": "print(1)", "timeout": -1}, "timeout"),
    ({"code": "print(1)", "timeout": "5"}, "timeout"),
    ({"code": "print(1)", "timeout": True}, "timeout"),
    ({"code": "print(1)", "servers": "time"}, "servers"),
    ({"code": "print(1)", "servers": ["no-such-server"]}, "servers"),
    ({"code": "print(1)", "language": "python"}, "language"),
    ({"code": "print(1)", "outputMode": "xml"}, "outputMode"),
]


@pytest.mark.parametrize(
    ("arguments", "argument"),
    VALIDATION_CASES,
    ids=[
        "missing-code",
        "empty-code",
        "code-not-a-string",
        "timeout-too-large",
        "timeout-negative",
        "timeout-a-string",
        "timeout-a-bool",
        "servers-not-a-list",
        "unknown-server",
        "unknown-argument",
        "unknown-output-mode",
    ],
)
async def test_a_bad_argument_is_a_validation_error_naming_it(
    client: Client, arguments: dict[str, Any], argument: str
) -> None:
    result = await _run(client, arguments)

    data = _structured(result)
    assert result.is_error is True
    assert data["status"] == "validation_error"
    assert data["exitCode"] is None
    assert data["error"].startswith(f"{argument}:")
    assert f"{argument}:" in _text(result)


async def test_output_mode_json_renders_the_structured_content_as_json(client: Client) -> None:
    result = await _run(client, {"code": "print('hi')", "outputMode": "json"})

    assert json.loads(_text(result)) == _structured(result)


async def test_output_mode_toon_renders_the_result_as_toon(client: Client) -> None:
    result = await _run(client, {"code": "print('hi')", "outputMode": "toon"})

    lines = _text(result).splitlines()
    assert "status: success" in lines
    assert "exitCode: 0" in lines


async def test_cancelling_a_call_kills_the_sandbox_and_the_server_keeps_serving(
    state_dir: Path, sandbox_runtime: Path | None
) -> None:
    # /bin/sleep would carry no marker: a Python child with the marker as an argument does.
    marker = f"mcp-sandbox-e2e-{uuid.uuid4().hex}"
    code = textwrap.dedent(
        f"""
        import subprocess, sys, time
        subprocess.Popen([sys.executable, "-c", "import time; time.sleep(1000)", {marker!r}])
        time.sleep(1000)
        """
    )

    async with _server(state_dir, sandbox_runtime) as client:

        async def call_until_cancelled() -> None:
            result = await client.call_tool("run_python", {"code": code, "timeout": 100})
            raise AssertionError(f"the call ended instead of being cancelled: {result.structured_content}")

        async with anyio.create_task_group() as group:
            group.start_soon(call_until_cancelled)
            with anyio.fail_after(CALL_BOUND):
                await _poll(lambda: bool(_pids_with(marker)))
            group.cancel_scope.cancel()

        with anyio.fail_after(10):
            await _poll(lambda: not _pids_with(marker))

        result = await _run(client, {"code": "print('still serving')"})
        assert _structured(result)["stdout"] == "still serving\n"
