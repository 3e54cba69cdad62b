"""RunAccess.handle as a hostile sandbox sees it: request dicts of any shape, against a real Mediator.

The downstream servers are real stdio processes of our fixture server under different aliases and
policies, plus one whose command does not exist. Whatever the request, ``handle`` answers with
``{"ok": ...}``: these tests check the kind of every refusal, the policy and caps the host
enforces, and that no credential of a downstream server reaches a reply or a stub.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import pytest

from downstream import FIXTURE_SERVER
from mcp_sandbox.bridge.discovery import Discovery, ServerSpec
from mcp_sandbox.bridge.mediator import Mediator, open_mediator
from mcp_sandbox.bridge.run_access import RunAccess
from mcp_sandbox.config import Settings
from mcp_sandbox.protocol import Call, Reply
from mcp_sandbox.sandbox.policy import TOOLS_MOUNT
from mcp_sandbox.state import StateLayout

pytestmark = pytest.mark.anyio

# Generous: a cold start of the fixture server (Python + the SDK) on a small, busy machine.
BOUND = 30.0
SECRET = "s3cr3t-downstream-credential-0815"
FIXTURE_TOOLS = 15  # every tool of tests/downstream/fixture_server.py


def _spec(alias: str, name: str, **extra: Any) -> ServerSpec:
    return ServerSpec(
        alias=alias, name=name, source=Path("t.json"), command=sys.executable, args=(str(FIXTURE_SERVER),), **extra
    )


SERVERS = {
    # Allowed in the default run; holds a credential; `crash` is denied by the operator.
    "fixture": _spec("fixture", "fixture", env={"FIXTURE_TOKEN": SECRET}, deny_tools=frozenset({"crash"})),
    # Allowed in the default run; only `echo` may be called.
    "limited": _spec("limited", "limited", allow_tools=frozenset({"echo"})),
    # Configured, never allowed in the default run; its name is not its alias.
    "other": _spec("other", "Other Server"),
    # Cannot start.
    "broken": ServerSpec(
        alias="broken", name="broken", source=Path("t.json"), command="/nonexistent/mcp-sandbox-no-such-server"
    ),
}


@pytest.fixture(scope="module")
async def bridge(module_state_dir: Path) -> AsyncIterator[Mediator]:
    await anyio.Path(module_state_dir).mkdir(parents=True, exist_ok=True)
    settings = Settings.of(state_dir=module_state_dir, discover_servers=False, connect_timeout=BOUND)
    async with open_mediator(
        settings.code_mode,
        Discovery(servers=SERVERS),
        None,
        StateLayout.of(settings.paths, settings.sandbox, settings.workspaces),
    ) as opened:
        yield opened


@pytest.fixture
async def access(bridge: Mediator) -> RunAccess:
    with anyio.fail_after(BOUND):
        return await bridge.open_run(["fixture", "limited"])


async def ask(access: RunAccess, request: dict[str, Any]) -> Reply:
    """The REPLY to a CALL frame carrying ``request`` (as the sandbox sent it: unchecked)."""
    with anyio.fail_after(BOUND):
        reply = await access.handle(Call(41, request))
    assert reply.id == 41
    return reply


def result_of(reply: Reply) -> Any:
    assert reply.ok, reply
    return reply.result


def error_of(reply: Reply) -> dict[str, Any]:
    """The error as the sandbox receives it (the REPLY's wire body)."""
    assert reply.error is not None, reply
    error: dict[str, Any] = reply.encode()["error"]
    return error


def texts(result: dict[str, Any]) -> list[str]:
    return [block["text"] for block in result["content"] if block["type"] == "text"]


def stub_files(directory: Path) -> dict[str, str]:
    """Every file of a stub tree, by relative path."""
    return {
        str(path.relative_to(directory)): path.read_text(encoding="utf-8")
        for path in sorted(directory.rglob("*"))
        if path.is_file()
    }


def with_settings(bridge: Mediator, **changes: Any) -> Mediator:
    """A bridge with other settings over the same (warm) servers."""
    return Mediator(dataclasses.replace(bridge.code_mode, **changes), bridge.layout, bridge.discovery, bridge.pool)


# --- malformed requests -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "request_",
    [{}, {"op": "format_disk"}, {"op": 5}, {"op": None}, {"op": ["call_tool"]}, {"op": {"call_tool": 1}}],
    ids=["no-op", "unknown", "int", "none", "list", "dict"],
)
async def test_an_unknown_or_non_string_op_is_invalid(access: RunAccess, request_: dict[str, Any]) -> None:
    assert error_of(await ask(access, request_))["kind"] == "invalid"


@pytest.mark.parametrize(
    "request_",
    [
        {"tool": "echo", "arguments": {"text": "x"}},
        {"server": 5, "tool": "echo"},
        {"server": None, "tool": "echo"},
        {"server": ["fixture"], "tool": "echo"},
        {"server": "fixture"},
        {"server": "fixture", "tool": ""},
        {"server": "fixture", "tool": 7},
        {"server": "fixture", "tool": ["echo"]},
        {"server": "fixture", "tool": "echo", "arguments": None},
        {"server": "fixture", "tool": "echo", "arguments": ["x"]},
        {"server": "fixture", "tool": "echo", "arguments": "text=x"},
    ],
    ids=[
        "no-server",
        "server-int",
        "server-none",
        "server-list",
        "no-tool",
        "tool-empty",
        "tool-int",
        "tool-list",
        "arguments-none",
        "arguments-list",
        "arguments-str",
    ],
)
async def test_a_call_with_a_missing_or_ill_typed_field_is_invalid_and_not_counted(
    access: RunAccess, request_: dict[str, Any]
) -> None:
    assert error_of(await ask(access, {"op": "call_tool", **request_}))["kind"] == "invalid"
    assert access.calls == 0


# --- which servers and tools a run may call ---------------------------------------------------


@pytest.mark.parametrize("server", ["other", "Other Server"], ids=["by-alias", "by-name"])
async def test_a_server_not_allowed_for_the_run_is_denied(access: RunAccess, server: str) -> None:
    error = error_of(await ask(access, {"op": "call_tool", "server": server, "tool": "echo", "arguments": {}}))
    assert error["kind"] == "denied"
    assert error["server"] == "Other Server"


async def test_a_server_that_does_not_exist_is_denied(access: RunAccess) -> None:
    reply = await ask(access, {"op": "call_tool", "server": "nosuch", "tool": "echo", "arguments": {"text": "x"}})
    assert error_of(reply)["kind"] == "denied"


async def test_a_tool_denied_by_the_policy_is_refused_without_reaching_the_server(access: RunAccess) -> None:
    pid = result_of(await ask(access, {"op": "call_tool", "server": "fixture", "tool": "pid"}))
    error = error_of(await ask(access, {"op": "call_tool", "server": "fixture", "tool": "crash"}))
    assert (error["kind"], error["server"]) == ("denied", "fixture")
    # `crash` would have ended the server: the same process still answers.
    assert result_of(await ask(access, {"op": "call_tool", "server": "fixture", "tool": "pid"})) == pid


async def test_a_tool_outside_allow_tools_is_refused(access: RunAccess) -> None:
    reply = await ask(access, {"op": "call_tool", "server": "limited", "tool": "add", "arguments": {"a": 1, "b": 2}})
    assert error_of(reply)["kind"] == "denied"
    allowed = await ask(access, {"op": "call_tool", "server": "limited", "tool": "echo", "arguments": {"text": "hi"}})
    assert texts(result_of(allowed)) == ["hi"]


async def test_a_tool_called_by_its_python_name_reaches_its_wire_name(access: RunAccess) -> None:
    request = {
        "op": "call_tool",
        "server": "fixture",
        "tool": "get_forecast_v2",
        "arguments": {"city": "Oslo", "days": 2},
    }
    assert texts(result_of(await ask(access, request))) == ["Oslo: sunny for 2 day(s)"]


async def test_a_structured_result_keeps_its_structured_content(access: RunAccess) -> None:
    request = {"op": "call_tool", "server": "fixture", "tool": "add", "arguments": {"a": 40, "b": 2}}
    assert result_of(await ask(access, request))["structuredContent"] == {"result": 42}


# --- caps ----------------------------------------------------------------------------------------


async def test_a_run_is_denied_calls_beyond_max_tool_calls(bridge: Mediator) -> None:
    with anyio.fail_after(BOUND):
        run = await with_settings(bridge, max_tool_calls=3).open_run(["fixture"])
    echo = {"op": "call_tool", "server": "fixture", "tool": "echo", "arguments": {"text": "x"}}
    for _ in range(3):
        result_of(await ask(run, echo))
    assert error_of(await ask(run, echo))["kind"] == "denied"
    # Other requests are not capped.
    assert [server["alias"] for server in result_of(await ask(run, {"op": "list_servers"}))] == ["fixture"]


async def test_a_result_past_max_tool_result_bytes_is_dropped_and_so_are_later_ones(bridge: Mediator) -> None:
    with anyio.fail_after(BOUND):
        run = await with_settings(bridge, max_tool_result_bytes=4096).open_run(["fixture"])
    small = {"op": "call_tool", "server": "fixture", "tool": "echo", "arguments": {"text": "small"}}
    assert texts(result_of(await ask(run, small))) == ["small"]

    big = await ask(run, {"op": "call_tool", "server": "fixture", "tool": "big", "arguments": {"mebibytes": 0.01}})
    assert error_of(big)["kind"] == "denied"
    assert "x" * 4096 not in json.dumps(big.encode())
    assert error_of(await ask(run, small))["kind"] == "denied"


# --- tool errors and credentials ---------------------------------------------------------------


async def test_a_tool_error_has_kind_tool_and_the_tools_message(access: RunAccess) -> None:
    message = "the disk is on fire: ✓ 🔥"
    reply = await ask(
        access, {"op": "call_tool", "server": "fixture", "tool": "fail", "arguments": {"message": message}}
    )
    assert error_of(reply) == {"kind": "tool", "message": message, "server": "fixture"}


async def test_no_reply_and_no_stub_contains_a_downstream_credential(access: RunAccess) -> None:
    # The credential does reach the server (so the test below is not vacuous).
    pid = result_of(await ask(access, {"op": "call_tool", "server": "fixture", "tool": "pid"}))["structuredContent"]
    environ = (await anyio.Path(f"/proc/{pid['result']}/environ").read_bytes()).split(b"\0")
    assert f"FIXTURE_TOKEN={SECRET}".encode() in environ

    requests: list[dict[str, Any]] = [
        {"op": "list_servers"},
        {"op": "discovered_servers"},
        {"op": "describe_server", "server": "fixture"},
        {"op": "list_tools", "server": "fixture"},
        {"op": "search_tools", "query": "token credential env secret", "detail": "full", "limit": 100},
        {"op": "query_tool_docs", "server": "fixture", "detail": "full"},
        {"op": "call_tool", "server": "fixture", "tool": "echo", "arguments": {"text": "hello"}},
        {"op": "call_tool", "server": "fixture", "tool": "fail", "arguments": {"message": "no"}},
        {"op": "call_tool", "server": "fixture", "tool": "crash"},
        {"op": "call_tool", "server": "fixture", "tool": "add", "arguments": {"a": "not a number"}},
        {"op": "call_tool", "server": "FIXTURE_TOKEN", "tool": "echo"},
    ]
    for request in requests:
        assert SECRET not in json.dumps((await ask(access, request)).encode(), ensure_ascii=False), request
    for mount in access.mounts:
        for file, source in stub_files(mount.source).items():
            assert SECRET not in source, file


# --- documentation requests -------------------------------------------------------------------


@pytest.mark.parametrize(
    "request_",
    [
        {},
        {"query": 5},
        {"query": "weather", "detail": "everything"},
        {"query": "weather", "detail": None},
        {"query": "weather", "limit": 0},
        {"query": "weather", "limit": 101},
        {"query": "weather", "limit": True},
        {"query": "weather", "limit": "5"},
        {"query": "weather", "limit": 2.5},
    ],
    ids=[
        "no-query",
        "query-int",
        "detail-unknown",
        "detail-none",
        "limit-0",
        "limit-101",
        "limit-bool",
        "limit-str",
        "limit-float",
    ],
)
async def test_search_tools_with_a_bad_query_detail_or_limit_is_invalid(
    access: RunAccess, request_: dict[str, Any]
) -> None:
    assert error_of(await ask(access, {"op": "search_tools", **request_}))["kind"] == "invalid"


async def test_search_tools_finds_a_tool_at_the_detail_asked(access: RunAccess) -> None:
    hits = result_of(await ask(access, {"op": "search_tools", "query": "temperature for a city", "detail": "name"}))
    assert hits[0]["tool"] == "weather"
    assert hits[0]["doc"] in {"fixture.weather", "other.weather"}  # `name` detail: alias.python_name


@pytest.mark.parametrize(
    ("request_", "kind"),
    [
        ({"server": "fixture", "detail": "everything"}, "invalid"),
        ({"server": "fixture", "tool": "nosuch"}, "invalid"),
        ({"server": "fixture", "tool": "crash"}, "invalid"),  # denied tools have no docs
        ({"server": 5}, "invalid"),
        ({"server": "nosuch"}, "denied"),
    ],
    ids=["detail-unknown", "tool-unknown", "tool-denied", "server-int", "server-unknown"],
)
async def test_query_tool_docs_refuses_a_bad_request(access: RunAccess, request_: dict[str, Any], kind: str) -> None:
    assert error_of(await ask(access, {"op": "query_tool_docs", **request_}))["kind"] == kind


@pytest.mark.parametrize("tool", ["get-forecast.v2", "get_forecast_v2"])
async def test_query_tool_docs_finds_a_tool_by_wire_or_python_name(access: RunAccess, tool: str) -> None:
    doc = result_of(
        await ask(access, {"op": "query_tool_docs", "server": "fixture", "tool": tool, "detail": "summary"})
    )
    assert "get_forecast_v2(" in doc
    assert "echo" not in doc


# --- servers --------------------------------------------------------------------------------------


async def test_list_servers_lists_only_the_runs_servers_with_their_permitted_tools(access: RunAccess) -> None:
    listed = result_of(await ask(access, {"op": "list_servers"}))
    assert listed == [
        {"name": "fixture", "alias": "fixture", "tools": FIXTURE_TOOLS - 1},
        {"name": "limited", "alias": "limited", "tools": 1},
    ]


async def test_discovered_servers_lists_every_server_and_whether_the_run_may_call_it(access: RunAccess) -> None:
    listed = result_of(await ask(access, {"op": "discovered_servers"}))
    assert {server["alias"]: server["allowed"] for server in listed} == {
        "fixture": True,
        "limited": True,
        "other": False,
        "broken": False,
    }


async def test_describe_server_of_a_server_not_allowed_works_without_a_stubs_path(access: RunAccess) -> None:
    described = result_of(await ask(access, {"op": "describe_server", "server": "Other Server"}))
    assert (described["alias"], described["allowed"], described["stubs"]) == ("other", False, None)
    assert described["transport"] == "stdio"
    assert "echo" in {tool["name"] for tool in described["tools"]}

    allowed = result_of(await ask(access, {"op": "describe_server", "server": "limited"}))
    assert (allowed["allowed"], allowed["stubs"]) == (True, f"{TOOLS_MOUNT}/limited")
    assert [tool["name"] for tool in allowed["tools"]] == ["echo"]


async def test_a_server_that_cannot_start_still_gets_a_toolless_stub_package(bridge: Mediator) -> None:
    with anyio.fail_after(BOUND):
        run = await bridge.open_run(["fixture", "broken"])
    mounts = {mount.target: mount for mount in run.mounts}
    assert set(mounts) == {f"{TOOLS_MOUNT}/fixture", f"{TOOLS_MOUNT}/broken"}
    broken = mounts[f"{TOOLS_MOUNT}/broken"]
    assert not broken.writable
    files = stub_files(broken.source)
    assert sorted(files) == ["__init__.py", "index.d.ts"]
    assert "UNAVAILABLE" in files["__init__.py"]
    assert "UNAVAILABLE" in files["index.d.ts"]

    call = await ask(run, {"op": "call_tool", "server": "broken", "tool": "echo", "arguments": {"text": "x"}})
    assert (error_of(call)["kind"], error_of(call)["server"]) == ("unavailable", "broken")
    listed = result_of(await ask(run, {"op": "list_servers"}))
    assert {server["alias"]: server["tools"] for server in listed} == {"fixture": FIXTURE_TOOLS - 1, "broken": None}
