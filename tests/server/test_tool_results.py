"""The tools' results over the SDK's in-memory client, on the sandbox test double (no bwrap).

The whole service runs in this process (tests/mcp_test_helpers.py: memory_client) with its
engine on tests/doubles/sandbox.py: what is checked is what the server makes of a run, not the
sandbox; tests/e2e/runs/test_tools.py runs the same calls on real sandboxes over every transport.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path

import anyio
import pytest
from mcp import Client
from mcp.types import TextContent

from doubles.sandbox import PlainProcessBackend
from mcp_sandbox.config import load_settings
from mcp_sandbox.server import build_server
from mcp_sandbox.server.service import open_service
from mcp_test_helpers import CALL_BOUND, memory_client, run_python, structured, text

pytestmark = pytest.mark.anyio

RESULT_KEYS = {"status", "exitCode", "stdout", "stderr", "durationMs", "truncated"}


@pytest.fixture(scope="module")
async def client(module_state_dir: Path) -> AsyncIterator[Client]:
    async with memory_client(module_state_dir, None, backend=PlainProcessBackend(), prestart_size=0) as client:
        yield client


async def test_tools_list_shows_run_python_with_its_output_schema(client: Client) -> None:
    with anyio.fail_after(CALL_BOUND):
        listing = await client.list_tools()

    tools = {tool.name: tool for tool in listing.tools}
    assert tools["run_python"].input_schema["required"] == ["code"]
    assert tools["run_python"].output_schema is not None
    assert set(tools["run_python"].output_schema["required"]) >= RESULT_KEYS


@pytest.mark.parametrize(
    ("code", "status", "exit_code", "stdout"),
    [("print(2 + 2)", "success", 0, "4\n"), ("import sys\nsys.exit(3)", "error", 3, "")],
    ids=["print", "sys-exit-3"],
)
async def test_a_run_is_reported_with_its_status_exit_code_and_stdout(
    client: Client, code: str, status: str, exit_code: int, stdout: str
) -> None:
    result = await run_python(client, {"code": code})

    data = structured(result)
    assert set(data) >= RESULT_KEYS
    assert (data["status"], data["exitCode"], data["stdout"]) == (status, exit_code, stdout)
    assert result.is_error is (status != "success")


async def test_success_renders_just_the_stdout(client: Client) -> None:
    assert text(await run_python(client, {"code": "print('just this')"})) == "just this\n"


async def test_an_uncaught_exception_is_an_error_showing_the_users_line_only(client: Client) -> None:
    result = await run_python(client, {"code": "x = 1\nraise ValueError('boom')\n"})

    data = structured(result)
    assert (result.is_error, data["status"], data["exitCode"]) == (True, "error", 1)
    assert "line 2" in data["stderr"]
    for runner_file in ("runner.py", "boot.py", "mcp_sandbox_runtime"):
        assert runner_file not in data["stderr"]
    assert "ValueError: boom" in text(result)


async def test_a_run_past_its_timeout_is_an_error_with_status_timeout(client: Client) -> None:
    result = await run_python(client, {"code": "import time\ntime.sleep(30)", "timeout": 0.5}, bound=15)

    data = structured(result)
    assert (result.is_error, data["status"]) == (True, "timeout")
    assert data["durationMs"] >= 500


async def test_huge_output_is_truncated_and_says_so(client: Client) -> None:
    result = await run_python(client, {"code": "import sys\nsys.stdout.write('BEGIN' + 'x' * (20 << 20))"})

    data = structured(result)
    assert (data["status"], data["truncated"]) == ("success", True)
    assert data["stdout"].startswith("BEGIN")
    assert "truncated" in data["stdout"][-200:]


async def test_a_bad_argument_is_a_validation_error_naming_it(client: Client) -> None:
    result = await run_python(client, {"code": "print(1)", "timeout": -1})

    assert result.is_error is True
    assert structured(result)["status"] == "validation_error"
    assert "timeout" in text(result)


async def test_a_conversation_keeps_its_variables_between_calls(client: Client) -> None:
    await run_python(client, {"code": "x = 41", "conversationId": "c-1"})
    result = await run_python(client, {"code": "print(x + 1)", "conversationId": "c-1"})

    assert structured(result)["stdout"] == "42\n"


async def test_output_mode_json_renders_the_structured_content_as_json(client: Client) -> None:
    result = await run_python(client, {"code": "print('j')", "outputMode": "json"})

    block = result.content[0]
    assert isinstance(block, TextContent)
    assert '"stdout"' in block.text


async def test_list_runners_names_the_tenants_secrets_and_never_their_values(module_state_dir: Path) -> None:
    value = "sk-" + "never-listed-0123"
    env = {"KEY": value, "MCP_SANDBOX_SECRET_OPENAI": '{ value_from = "env:KEY", hosts = ["api.openai.test"] }'}
    backend = PlainProcessBackend()
    async with memory_client(module_state_dir, None, backend=backend, prestart_size=0, env=env) as client:
        with anyio.fail_after(CALL_BOUND):
            runners = await client.call_tool("list_runners", {})
    assert structured(runners)["network"]["secrets"] == ["openai"]
    assert "openai" in text(runners) and value not in text(runners) and value not in str(structured(runners))


async def test_the_servers_schema_lookup_gives_each_tool_its_listed_schema_where_it_declares_headers(
    state_dir: Path,
) -> None:
    # The Streamable HTTP transport checks a tools/call's Mcp-Param-* headers against this lookup
    # when the server has one, instead of running the whole tools/list for every call; a schema
    # that declares no header (x-mcp-header) can reject nothing, and is not handed over to be walked.
    settings = load_settings(env={}, flags={"state_dir": str(state_dir), "discover_servers": False})
    async with open_service(settings, http=False, backend=PlainProcessBackend()) as service:
        server = build_server(service)
        async with Client(server) as client:
            with anyio.fail_after(CALL_BOUND):
                listed = (await client.list_tools()).tools

    assert server.get_tool_input_schema is not None
    declaring = {tool.name for tool in listed if '"x-mcp-header"' in json.dumps(tool.input_schema)}
    assert {tool.name: server.get_tool_input_schema(tool.name) for tool in listed} == {
        tool.name: tool.input_schema if tool.name in declaring else None for tool in listed
    }
    assert server.get_tool_input_schema("no_such_tool") is None
