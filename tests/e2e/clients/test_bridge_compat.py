"""Code written for the earlier code-execution bridge's in-sandbox API runs here unchanged.

The snippets are its README's (``Inspect Available Servers``) and its documented names
(``mcp_servers``, ``LOADED_MCP_SERVERS``, awaitable ``list_servers``/``list_tools``, ``MCPError``
as a ``RuntimeError``, the whole call result), run against real downstream servers (PyPI
``mcp-server-time``, npm ``server-memory``, our fixture server) in real sandboxes.
"""

from __future__ import annotations

import ast
import json
import textwrap
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client

import tool_cases as cases
from downstream import make_git_repo, require_installed, servers_config, write_servers_config
from mcp_test_helpers import memory_client, run_python, structured, text

pytestmark = [pytest.mark.e2e, pytest.mark.anyio]


@pytest.fixture(scope="module")
async def client(module_state_dir: Path, sandbox_runtime: Path | None) -> AsyncIterator[Client]:
    require_installed()
    directory = module_state_dir.parent / "downstream"
    directory.mkdir(parents=True)
    config = servers_config(directory, git_repo=make_git_repo(directory / "repo"))
    keep = {"time", "memory", "fixture"}
    config["mcpServers"] = {name: entry for name, entry in config["mcpServers"].items() if name in keep}
    write_servers_config(directory / "servers.json", config)
    servers = str(directory / "servers.json")
    async with memory_client(module_state_dir, sandbox_runtime, read_timeout=None, servers_config=servers) as client:
        yield client


async def run(client: Client, code: str, servers: list[str]) -> str:
    result = await run_python(client, {"code": textwrap.dedent(code), "servers": servers}, bound=120)
    data = structured(result)
    assert data["status"] == "success", data
    stdout: str = data["stdout"]
    return stdout


# The earlier bridge's README, "Inspect Available Servers", verbatim.
INSPECT = """\
from mcp import runtime

print("Discovered:", runtime.discovered_servers())
print("Cached servers:", runtime.list_servers_sync())
print("Loaded metadata:", runtime.list_loaded_server_metadata())
print("Selectable via RPC:", await runtime.list_servers())

# Peek at tool docs for a server that's already loaded in this run
loaded = runtime.list_loaded_server_metadata()
if loaded:
  first = runtime.describe_server(loaded[0]["name"])
  for tool in first["tools"]:
    print(tool["alias"], "→", tool.get("description", ""))

# Ask for summaries or full schemas only when needed
if loaded:
  summaries = await runtime.query_tool_docs(loaded[0]["name"])
  detailed = await runtime.query_tool_docs(
    loaded[0]["name"],
    tool=summaries[0]["toolAlias"],
    detail="full",
  )
  print("Summaries:", summaries)
  print("Cached tools:", runtime.list_tools_sync(loaded[0]["name"]))
  print("Detailed doc:", detailed)

# Fuzzy search across loaded servers without rehydrating every schema
results = await runtime.search_tool_docs("calendar events", limit=3)
for result in results:
  print(result["server"], result["tool"], result.get("description", ""))

# Synchronous helpers for quick answers without extra awaits
print("Capability summary:", runtime.capability_summary())
print("Docs from cache:", runtime.query_tool_docs_sync(loaded[0]["name"]) if loaded else [])
print("Search from cache:", runtime.search_tool_docs_sync("calendar"))
"""


def printed(stdout: str, label: str) -> Any:
    """The Python literal printed after ``label: `` on its line."""
    line = next(line for line in stdout.splitlines() if line.startswith(f"{label}: "))
    return ast.literal_eval(line.removeprefix(f"{label}: "))


async def test_the_bridges_inspect_snippet_runs_unchanged(client: Client) -> None:
    stdout = await run(client, INSPECT, ["time"])
    assert set(printed(stdout, "Discovered")) == {"time", "memory", "fixture"}  # names, as the bridge's
    assert printed(stdout, "Cached servers") == ("time",)
    assert printed(stdout, "Selectable via RPC") == ("time",)
    (metadata,) = printed(stdout, "Loaded metadata")
    assert metadata["name"] == "time" and metadata["alias"] == "time"
    tools = {tool["name"]: tool for tool in metadata["tools"]}
    assert "get_current_time" in tools
    assert tools["get_current_time"]["input_schema"]["properties"]["timezone"]
    assert "get_current_time →" in stdout
    summaries = printed(stdout, "Summaries")
    assert {doc["tool"] for doc in summaries} >= {"get_current_time", "convert_time"}
    assert all(doc["server"] == "time" and doc["serverAlias"] == "time" for doc in summaries)
    detailed = printed(stdout, "Detailed doc")
    assert detailed["tool"] == summaries[0]["tool"]
    assert "properties" in detailed["inputSchema"]
    assert "mcp_servers" in stdout  # the manual names the earlier names
    assert printed(stdout, "Docs from cache") == summaries


async def test_the_bridges_globals_and_awaitable_helpers_are_there(client: Client) -> None:
    stdout = await run(
        client,
        """
        from mcp import runtime
        print(LOADED_MCP_SERVERS)
        print(mcp_servers["time"] is mcp_time, sorted(mcp_servers))
        listed = await mcp_time.list_tools()
        print(sorted(tool["name"] for tool in listed), "inputSchema" in listed[0])
        awaited = await runtime.list_tools("fixture")
        plain = runtime.list_tools("fixture")
        has_schema = any(t["name"] == "add" and "inputSchema" in t for t in awaited)
        print(has_schema, plain[0]["alias"] == plain[0]["python_name"])
        print(runtime.list_servers()[0]["name"], await runtime.list_servers())
        print(issubclass(runtime.MCPError, RuntimeError))
        try:
            await mcp_fixture.fail(message="boom")
        except RuntimeError as error:
            print("caught", type(error).__name__, "boom" in str(error))
        """,
        ["fixture", "time"],
    )
    lines = stdout.splitlines()
    assert ast.literal_eval(lines[0]) == ("fixture", "time")
    assert lines[1] == "True ['fixture', 'time']"
    assert lines[2] == "['convert_time', 'get_current_time'] True"
    assert lines[3] == "True True"
    assert lines[4] == "fixture ('fixture', 'time')"
    assert lines[5] == "True"
    assert lines[6] == "caught MCPError True"


async def test_a_run_without_servers_still_defines_the_bridges_names(client: Client) -> None:
    stdout = await run(client, "print(mcp_servers, LOADED_MCP_SERVERS)", [])
    assert stdout == "{} ()\n"


async def test_the_whole_call_result_is_available_as_the_bridge_returned_it(client: Client) -> None:
    stdout = await run(
        client,
        """
        from mcp import runtime
        added = await runtime.call_tool_raw("fixture", "add", {"a": 40, "b": 2})
        print(added["isError"], added["structuredContent"], added["content"][0]["type"])
        failed = await runtime.call_tool_raw("fixture", "fail", {"message": "boom"})
        print(failed["isError"], failed["content"][0]["text"])
        await mcp_memory.create_entities(entities=[{"name": "Ada", "entityType": "person", "observations": []}])
        graph = await runtime.call_tool_raw("memory", "read_graph")
        print(sorted(graph), graph["isError"])
        """,
        ["fixture", "memory"],
    )
    lines = stdout.splitlines()
    assert lines[0] == "False {'result': 42} text"
    assert lines[1] == "True boom"
    assert "content" in ast.literal_eval(lines[2].rsplit(" ", 1)[0])


@pytest.fixture
async def raw_client(state_dir: Path, module_state_dir: Path, sandbox_runtime: Path | None) -> AsyncIterator[Client]:
    """A server with ``tool_results = "raw"``, for the earlier bridge's users, on the same downstream servers."""
    servers = str(module_state_dir.parent / "downstream" / "servers.json")
    async with memory_client(
        state_dir, sandbox_runtime, read_timeout=None, servers_config=servers, tool_results="raw"
    ) as client:
        yield client


async def test_with_tool_results_raw_calls_return_the_whole_result_as_the_bridge_did(
    client: Client, raw_client: Client
) -> None:
    # The earlier bridge's documented use of a call's result, unchanged: `g["content"][0]["text"]`.
    code = """
        from mcp import runtime
        g = await mcp_fixture.add(a=40, b=2)
        print(g["content"][0]["text"], g["isError"], g["structuredContent"])
        echoed = await runtime.call_tool("fixture", "echo", {"text": "hi"})
        print(echoed["content"][0]["text"])
        print(mcp_fixture.echo_sync(text="sync")["content"][0]["text"])
        failed = await mcp_fixture.fail(message="boom")
        print(failed["isError"], failed["content"][0]["text"])
        print(await runtime.call_tool("fixture", "add", {"a": 1, "b": 1}, raw=True))
        """
    stdout = await run(raw_client, code, ["fixture"])
    assert stdout.splitlines() == [
        "42 False {'result': 42}",
        "hi",
        "sync",
        "True boom",
        "{'structuredContent': {'result': 2}, 'content': ['2']}",  # an explicit raw=True keeps its shape
    ]
    # The default stays the value.
    stdout = await run(client, "print(await mcp_fixture.add(a=40, b=2), mcp_fixture.echo_sync(text='x'))", ["fixture"])
    assert stdout == "{'result': 42} x\n"


async def test_with_tool_results_raw_typescript_calls_return_the_whole_result(
    client: Client, raw_client: Client
) -> None:
    code = """
        const g: any = await mcp.servers.fixture.add({ a: 40, b: 2 });
        const echoed: any = await mcp.runtime.callTool("fixture", "echo", { text: "hi" });
        const failed: any = await mcp.servers.fixture.fail({ message: "boom" });
        console.log(JSON.stringify([g.content[0].text, g.isError, g.structuredContent, echoed.content[0].text,
          failed.isError, failed.content[0].text]));
    """
    arguments = {"code": textwrap.dedent(code), "language": "typescript", "servers": ["fixture"]}
    with anyio.fail_after(120):
        raw = structured(await raw_client.call_tool("run_code", arguments))
        value = structured(
            await client.call_tool(
                "run_code",
                {**arguments, "code": "console.log(JSON.stringify(await mcp.servers.fixture.add({ a: 40, b: 2 })));"},
            )
        )
    assert raw["status"] == "success", raw
    assert json.loads(raw["stdout"]) == ["42", False, {"result": 42}, "hi", True, "boom"]
    assert (value["status"], value["stdout"]) == ("success", '{"result":42}\n'), value


async def test_the_bridges_smaller_names_discovered_servers_tools_and_unknown_tools(client: Client) -> None:
    stdout = await run(
        client,
        """
        from mcp import runtime
        print(sorted(runtime.discovered_servers()))
        print(sorted(entry["name"] for entry in runtime.discovered_servers(detailed=True)))
        entries = runtime.discovered_server_entries()
        print(sorted((entry["name"], entry["allowed"]) for entry in entries))
        tools = {tool["name"]: tool for tool in runtime.describe_server("time")["tools"]}
        print(sorted(tools["get_current_time"]["input_schema"]["properties"]))
        print(sorted(tool["name"] for tool in mcp_time.TOOLS))
        import mcp.servers.time as time_module
        print(sorted(time_module.TOOL_MAP), time_module.TOOL_MAP["convert_time"]["name"])
        print(sorted(mcp_time.TOOL_MAP["get_current_time"]))
        try:
            await mcp_time.no_such_tool(x=1)
        except RuntimeError as error:
            print(type(error).__name__, error.kind, "no_such_tool" in str(error), "get_current_time" in str(error))
        try:
            mcp_time.no_such_tool_sync()
        except runtime.MCPError as error:
            print("sync", error.tool)
        print(hasattr(mcp_time, "__wrapped__"), hasattr(mcp_time, "_private"), callable(mcp_time.anything))
        """,
        ["time"],
    )
    lines = stdout.splitlines()
    assert ast.literal_eval(lines[0]) == ["fixture", "memory", "time"]
    assert ast.literal_eval(lines[1]) == ["fixture", "memory", "time"]
    assert ast.literal_eval(lines[2]) == [("fixture", False), ("memory", False), ("time", True)]
    assert ast.literal_eval(lines[3]) == ["timezone"]
    assert ast.literal_eval(lines[4]) == ["convert_time", "get_current_time"]
    assert lines[5] == "['convert_time', 'get_current_time'] convert_time"
    assert ast.literal_eval(lines[6]) == ["alias", "description", "input_schema", "name"]
    assert lines[7] == "MCPError invalid True True"
    assert lines[8] == "sync no_such_tool_sync"
    assert lines[9] == "False False True"


async def test_a_timeout_above_the_maximum_is_clamped_and_said(client: Client) -> None:
    result = await run_python(client, {"code": "print('ran')", "timeout": 100000}, bound=120)
    data = structured(result)
    assert data["status"] == "success", data
    assert data["timeoutClamped"] == {"requested": 100000, "used": 120}
    assert "timeout 100000 s is above this server's maximum: the run had 120 s" in text(result)
    for bad in (0, -1, "soon"):
        refused = structured(await run_python(client, {"code": "print(1)", "timeout": bad}))
        assert refused["status"] == "validation_error" and refused["error"].startswith("timeout"), refused


async def test_toon_output_is_the_bridges_fenced_block_with_a_summary_and_lines(client: Client) -> None:
    # The earlier bridge's test of its TOON answers, replayed: a ```toon block, decoded.
    await cases.toon_output_is_the_earlier_bridges_fenced_block_with_a_summary_and_lines(client, bound=120)
