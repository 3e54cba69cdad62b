"""The real downstream MCP servers that `make downstream` installs, each reached with the SDK's client.

One smoke test per server (connect over stdio, list tools, call one, check the protocol era it
negotiated), then every tool of our fixture server.
"""

from __future__ import annotations

import base64
import json
import os
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client
from mcp.shared.exceptions import MCPError
from mcp.types import CallToolResult, EmbeddedResource, ImageContent, TextContent, TextResourceContents

from downstream import (
    SERVER_NAMES,
    make_git_repo,
    require_installed,
    servers_config,
    stdio_parameters,
    write_servers_config,
)
from downstream.fixture_server import RESOURCE_TEXT, RESOURCE_URI, tiny_png

# slow: starts the pinned downstream servers (`make downstream`), each in seconds.
pytestmark = [pytest.mark.anyio, pytest.mark.slow]

# Generous: a cold start of node or Python on a small, busy machine; 20 MiB through JSON-RPC.
CONNECT_BOUND = 30.0
CALL_BOUND = 30.0

HANDSHAKE_ERA = "2025-11-25"  # initialize and sessions (the npm servers' TypeScript SDK)
STATELESS_ERA = "2026-07-28"  # server/discover, no initialize (the Python SDK 2.x)


def _text(result: CallToolResult) -> str:
    assert not result.is_error, result
    assert len(result.content) == 1
    block = result.content[0]
    assert isinstance(block, TextContent)
    return block.text


@dataclass(frozen=True)
class Smoke:
    era: str
    tools: frozenset[str]
    tool: str
    arguments: Callable[[Path], dict[str, Any]]  # of the test's tmp_path, after preparing what they name
    check: Callable[[CallToolResult, Path], None]


def _check_echo(result: CallToolResult, tmp: Path) -> None:
    assert _text(result) == "Echo: hello downstream"


def _check_memory(result: CallToolResult, tmp: Path) -> None:
    assert "probe" in _text(result)
    # MEMORY_FILE_PATH took effect: the graph went to the file the config names.
    assert "probe" in (tmp / "memory.jsonl").read_text(encoding="utf-8")


def _filesystem_arguments(tmp: Path) -> dict[str, Any]:
    note = tmp / "files" / "note.txt"  # the allowed directory servers_config created
    note.write_text("written by the test\n", encoding="utf-8")
    return {"path": str(note)}


def _check_filesystem(result: CallToolResult, tmp: Path) -> None:
    assert _text(result) == "written by the test\n"


def _check_time(result: CallToolResult, tmp: Path) -> None:
    assert json.loads(_text(result))["timezone"] == "UTC"


def _check_git(result: CallToolResult, tmp: Path) -> None:
    log = _text(result)
    assert "first commit" in log
    assert "second commit" in log


def _check_fixture(result: CallToolResult, tmp: Path) -> None:
    assert result.structured_content == {"result": 5}


SMOKE: dict[str, Smoke] = {
    "everything": Smoke(
        HANDSHAKE_ERA,
        frozenset(
            {
                "echo",
                "get-annotated-message",
                "get-env",
                "get-resource-links",
                "get-resource-reference",
                "get-structured-content",
                "get-sum",
                "get-tiny-image",
                "gzip-file-as-resource",
                "simulate-research-query",
                "toggle-simulated-logging",
                "toggle-subscriber-updates",
                "trigger-long-running-operation",
            }
        ),
        "echo",
        lambda tmp: {"message": "hello downstream"},
        _check_echo,
    ),
    "memory": Smoke(
        HANDSHAKE_ERA,
        frozenset(
            {
                "add_observations",
                "create_entities",
                "create_relations",
                "delete_entities",
                "delete_observations",
                "delete_relations",
                "open_nodes",
                "read_graph",
                "search_nodes",
            }
        ),
        "create_entities",
        lambda tmp: {"entities": [{"name": "probe", "entityType": "test", "observations": ["made by a smoke test"]}]},
        _check_memory,
    ),
    "filesystem": Smoke(
        HANDSHAKE_ERA,
        frozenset(
            {
                "create_directory",
                "directory_tree",
                "edit_file",
                "get_file_info",
                "list_allowed_directories",
                "list_directory",
                "list_directory_with_sizes",
                "move_file",
                "read_file",
                "read_media_file",
                "read_multiple_files",
                "read_text_file",
                "search_files",
                "write_file",
            }
        ),
        "read_text_file",
        _filesystem_arguments,
        _check_filesystem,
    ),
    "time": Smoke(
        STATELESS_ERA,
        frozenset({"convert_time", "get_current_time"}),
        "get_current_time",
        lambda tmp: {"timezone": "UTC"},
        _check_time,
    ),
    "git": Smoke(
        STATELESS_ERA,
        frozenset(
            {
                "git_add",
                "git_branch",
                "git_checkout",
                "git_commit",
                "git_create_branch",
                "git_diff",
                "git_diff_staged",
                "git_diff_unstaged",
                "git_log",
                "git_reset",
                "git_show",
                "git_status",
            }
        ),
        "git_log",
        lambda tmp: {"repo_path": str(tmp / "repo")},
        _check_git,
    ),
    "fixture": Smoke(
        STATELESS_ERA,
        frozenset(
            {
                "add",
                "big",
                "class",
                "crash",
                "echo",
                "fail",
                "garble",
                "get-forecast.v2",
                "image",
                "pid",
                "rendezvous",
                "resource",
                "sleep",
                "trace_context",
                "weather",
            }
        ),
        "add",
        lambda tmp: {"a": 2, "b": 3},
        _check_fixture,
    ),
}


def _client(config: dict[str, Any], name: str) -> Client:
    # read_timeout_seconds bounds each request, the connection's own included.
    return Client(stdio_parameters(config["mcpServers"][name]), mode="auto", read_timeout_seconds=CONNECT_BOUND)


def test_the_smoke_table_covers_every_server() -> None:
    assert set(SMOKE) == set(SERVER_NAMES)


@pytest.mark.parametrize("name", SERVER_NAMES)
async def test_each_server_lists_its_tools_answers_a_call_and_negotiates_its_era(name: str, tmp_path: Path) -> None:
    if name != "fixture":  # which needs only this interpreter
        require_installed()
    git_repo = make_git_repo(tmp_path / "repo") if name == "git" else tmp_path / "repo"
    config = servers_config(tmp_path, git_repo=git_repo, include=[name])
    smoke = SMOKE[name]
    arguments = smoke.arguments(tmp_path)

    with anyio.fail_after(CONNECT_BOUND + 2 * CALL_BOUND):
        async with _client(config, name) as client:
            listing = await client.list_tools()
            result = await client.call_tool(smoke.tool, arguments)
            era = client.protocol_version

    assert {tool.name for tool in listing.tools} == smoke.tools
    assert era == smoke.era
    smoke.check(result, tmp_path)


def test_a_servers_config_round_trips_through_its_json_file(tmp_path: Path) -> None:
    config = servers_config(tmp_path, git_repo=tmp_path / "repo", include=["time", "fixture"])

    path = write_servers_config(tmp_path / "servers.json", config)

    assert json.loads(path.read_text(encoding="utf-8")) == config
    assert set(config["mcpServers"]) == {"time", "fixture"}


def test_a_servers_config_refuses_an_unknown_server(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="nonesuch"):
        servers_config(tmp_path, git_repo=tmp_path / "repo", include=["time", "nonesuch"])


# --- the fixture server, tool by tool ------------------------------------------------------


@pytest.fixture(scope="module")
async def fixture_client(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Client]:
    # The fixture server needs only this interpreter, not `make downstream`.
    tmp = tmp_path_factory.mktemp("fixture")
    async with _client(servers_config(tmp, git_repo=tmp / "repo", include=["fixture"]), "fixture") as client:
        yield client


async def _call(client: Client, tool: str, arguments: dict[str, Any] | None = None) -> CallToolResult:
    with anyio.fail_after(CALL_BOUND):
        return await client.call_tool(tool, arguments or {})


async def test_fixture_echo_returns_the_text_unchanged(fixture_client: Client) -> None:
    assert _text(await _call(fixture_client, "echo", {"text": "héllo ✓"})) == "héllo ✓"


async def test_fixture_add_and_weather_have_output_schemas_and_structured_results(fixture_client: Client) -> None:
    with anyio.fail_after(CALL_BOUND):
        tools = {tool.name: tool for tool in (await fixture_client.list_tools()).tools}
    added = await _call(fixture_client, "add", {"a": 40, "b": 2})
    weather = await _call(fixture_client, "weather", {"city": "Paris"})
    fahrenheit = await _call(fixture_client, "weather", {"city": "Paris", "units": "f"})

    assert tools["add"].output_schema is not None
    assert tools["weather"].output_schema is not None
    assert tools["weather"].input_schema["properties"]["units"]["enum"] == ["c", "f"]
    assert added.structured_content == {"result": 42}
    assert weather.structured_content == {"city": "Paris", "temperature": 15.0, "units": "c"}
    assert fahrenheit.structured_content == {"city": "Paris", "temperature": 59.0, "units": "f"}


async def test_fixture_fail_is_a_tool_error_carrying_the_message(fixture_client: Client) -> None:
    result = await _call(fixture_client, "fail", {"message": "the downstream said no"})

    assert result.is_error is True
    assert result.content == [TextContent(text="the downstream said no")]


async def test_fixture_big_returns_20_mib_of_text(fixture_client: Client) -> None:
    assert len(_text(await _call(fixture_client, "big", {"mebibytes": 20}))) == 20 << 20


async def test_fixture_sleep_answers_after_sleeping(fixture_client: Client) -> None:
    assert _text(await _call(fixture_client, "sleep", {"seconds": 0.01})) == "slept 0.01"


async def test_fixture_rendezvous_returns_once_the_parties_are_in_flight_together(fixture_client: Client) -> None:
    results: list[Any] = []

    async def one() -> None:
        results.append((await fixture_client.call_tool("rendezvous", {"parties": 3})).structured_content)

    with anyio.fail_after(CALL_BOUND):
        async with anyio.create_task_group() as group:
            for _ in range(3):
                group.start_soon(one)

    assert results == [{"result": 3}] * 3


async def test_fixture_image_is_a_png(fixture_client: Client) -> None:
    result = await _call(fixture_client, "image")

    [block] = result.content
    assert isinstance(block, ImageContent)
    assert block.mime_type == "image/png"
    assert base64.b64decode(block.data) == tiny_png()
    assert tiny_png().startswith(b"\x89PNG\r\n\x1a\n")


async def test_fixture_resource_is_an_embedded_text_resource(fixture_client: Client) -> None:
    result = await _call(fixture_client, "resource")

    [block] = result.content
    assert isinstance(block, EmbeddedResource)
    assert block.resource == TextResourceContents(uri=RESOURCE_URI, mime_type="text/plain", text=RESOURCE_TEXT)


async def test_fixture_tools_with_non_identifier_names_are_callable(fixture_client: Client) -> None:
    forecast = await _call(fixture_client, "get-forecast.v2", {"city": "Oslo", "days": 2})
    klass = await _call(fixture_client, "class", {"name": "x"})

    assert forecast.structured_content == {"result": "Oslo: sunny for 2 day(s)"}
    assert _text(klass) == "class x"


async def test_fixture_crash_kills_the_server_and_a_new_one_has_another_pid(tmp_path: Path) -> None:
    config = servers_config(tmp_path, git_repo=tmp_path / "repo", include=["fixture"])

    async with _client(config, "fixture") as client:
        first = (await _call(client, "pid")).structured_content
        with pytest.raises(MCPError):
            await _call(client, "crash")
    async with _client(config, "fixture") as client:
        second = (await _call(client, "pid")).structured_content

    assert first is not None and second is not None
    assert first["result"] != second["result"]
    assert os.getpid() not in {first["result"], second["result"]}
