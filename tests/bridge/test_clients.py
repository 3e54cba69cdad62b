"""ClientPool against real stdio servers: lazy start, caching, crashes, timeouts, broken servers, shutdown.

Each test marks the processes it starts with an environment variable of its own, so it finds
them (and only them) in /proc without knowing how the SDK spawns them. The tests that bound a
timeout or a start in a few seconds are marked ``serial`` (``make test`` runs them alone): on a
busy machine the fixture server can take longer than a 5 s connect timeout to start, an echo
longer than a 0.5 s call timeout to answer, or ``sleep`` longer than a 1 s one to be seen. The
others bound only a hang, or a stop well past what it takes, and run on the parallel workers.
"""

from __future__ import annotations

import itertools
import socket
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import anyio
import mcp_types as types
import pytest

from downstream import FIXTURE_SERVER
from mcp_sandbox.bridge.clients import ClientPool, open_client_pool, restart_delay
from mcp_sandbox.bridge.discovery import ServerSpec
from mcp_sandbox.errors import DownstreamError
from mcp_test_helpers import poll

pytestmark = pytest.mark.anyio

# Generous: a cold start of the fixture server (Python + the SDK) on a small, busy machine.
BOUND = 30.0
MARK = "MCP_SANDBOX_POOL_TEST"


def marker() -> dict[str, str]:
    return {MARK: uuid.uuid4().hex}


def fixture_spec(alias: str = "fixture", env: dict[str, str] | None = None) -> ServerSpec:
    return ServerSpec(
        alias=alias,
        name=alias,
        source=Path("t.json"),
        command=sys.executable,
        args=(str(FIXTURE_SERVER),),
        env=env or {},
    )


def command_spec(alias: str, command: str, *args: str, env: dict[str, str] | None = None) -> ServerSpec:
    return ServerSpec(alias=alias, name=alias, source=Path("t.json"), command=command, args=args, env=env or {})


def _proc_entries() -> Iterator[Path]:
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            yield entry


def marked_pids(env: dict[str, str]) -> set[int]:
    """The live processes whose environment holds ``env``'s one variable (zombies have none)."""
    ((key, value),) = env.items()
    wanted = f"{key}={value}".encode()
    found: set[int] = set()
    for entry in _proc_entries():
        try:
            environ = (entry / "environ").read_bytes()
        except OSError:  # another user's process, or one that just ended
            continue
        if wanted in environ.split(b"\0"):
            found.add(int(entry.name))
    return found


def exists(pid: int) -> bool:
    """Whether ``pid`` is still in the process table (running, or a zombie nobody reaped)."""
    return Path(f"/proc/{pid}").exists()


async def wait_until_gone(pids: set[int]) -> None:
    """Poll /proc until every pid is reaped; the caller bounds the wait."""
    await poll(lambda: not any(exists(pid) for pid in pids), interval=0.02)


def tool_names(tools: tuple[types.Tool, ...]) -> set[str]:
    return {tool.name for tool in tools}


async def server_pid(pool: ClientPool, alias: str) -> int:
    result = await pool.call(alias, "pid", {})
    assert not result.is_error, result
    assert result.structured_content is not None
    pid = result.structured_content["result"]
    assert isinstance(pid, int)
    return pid


@pytest.mark.slow
async def test_a_server_starts_on_first_use_only() -> None:
    lazy_mark, first_mark = marker(), marker()
    servers = {"lazy": fixture_spec("lazy", lazy_mark), "first": fixture_spec("first", first_mark)}
    with anyio.fail_after(BOUND):
        async with open_client_pool(servers) as pool:
            assert marked_pids(first_mark) == set()
            assert "echo" in tool_names(await pool.tools("first"))
            assert marked_pids(first_mark) == {await server_pid(pool, "first")}
            # By now an eager pool would have started `lazy` too.
            assert marked_pids(lazy_mark) == set()

            await server_pid(pool, "lazy")  # a call starts it as well as tools() does
            assert len(marked_pids(lazy_mark)) == 1


@pytest.mark.slow
async def test_the_tool_list_is_cached_while_the_connection_lives() -> None:
    with anyio.fail_after(BOUND):
        async with open_client_pool({"fixture": fixture_spec()}) as pool:
            first = await pool.tools("fixture")
            pid = await server_pid(pool, "fixture")
            second = await pool.tools("fixture")
            assert second is first
            assert await server_pid(pool, "fixture") == pid


@pytest.mark.slow
async def test_a_crashed_server_fails_that_call_and_the_next_call_starts_it_again() -> None:
    with anyio.fail_after(BOUND):
        async with open_client_pool({"fixture": fixture_spec()}) as pool:
            before = await server_pid(pool, "fixture")
            with pytest.raises(DownstreamError) as caught:
                await pool.call("fixture", "crash", {})
            assert (caught.value.server, caught.value.tool) == ("fixture", "crash")

            after = await server_pid(pool, "fixture")
            assert after != before
            await wait_until_gone({before})


@pytest.mark.serial
async def test_a_call_past_the_call_timeout_fails_and_the_pool_still_works() -> None:
    with anyio.fail_after(BOUND):
        async with open_client_pool({"fixture": fixture_spec()}, call_timeout=0.5) as pool:
            await pool.tools("fixture")
            with pytest.raises(DownstreamError) as caught:
                await pool.call("fixture", "sleep", {"seconds": 5})
            assert caught.value.tool == "sleep"

            result = await pool.call("fixture", "echo", {"text": "still here"})
            assert not result.is_error
            assert [block.text for block in result.content if isinstance(block, types.TextContent)] == ["still here"]


async def test_a_command_that_does_not_exist_is_a_downstream_error_naming_it() -> None:
    command = f"/nonexistent/mcp-sandbox-no-such-server-{uuid.uuid4().hex[:8]}"
    with anyio.fail_after(BOUND):
        async with open_client_pool({"missing": command_spec("missing", command)}) as pool:
            with pytest.raises(DownstreamError) as caught:
                await pool.tools("missing")
    assert caught.value.server == "missing"
    assert command in caught.value.message


@pytest.mark.slow
@pytest.mark.serial
async def test_a_server_that_never_speaks_mcp_fails_after_the_connect_timeout_and_is_stopped() -> None:
    mark = marker()
    spec = command_spec("silent", "sleep", "60", env=mark)
    seen: set[int] = set()
    with anyio.fail_after(BOUND):
        async with open_client_pool({"silent": spec}, connect_timeout=1.0) as pool:
            outcome: list[BaseException] = []

            async def start() -> None:
                try:
                    await pool.tools("silent")
                except DownstreamError as exc:
                    outcome.append(exc)

            def running_or_over() -> bool:
                seen.update(marked_pids(mark))
                return bool(seen) or bool(outcome)

            async with anyio.create_task_group() as group:
                group.start_soon(start)
                await poll(running_or_over, interval=0.02)  # catch `sleep` while the pool waits on it
            assert len(outcome) == 1
            assert isinstance(outcome[0], DownstreamError)
            assert outcome[0].server == "silent"
        assert len(seen) == 1, "the `sleep` process was never seen running"
        await wait_until_gone(seen)
    assert marked_pids(mark) == set()


@pytest.mark.slow
@pytest.mark.serial
async def test_all_tools_starts_every_server_at_once_and_reports_the_broken_one() -> None:
    silent_a, silent_b = marker(), marker()
    servers = {
        "silent_a": command_spec("silent_a", "sleep", "60", env=silent_a),
        "silent_b": command_spec("silent_b", "sleep", "60", env=silent_b),
        "good": fixture_spec("good"),
        "missing": command_spec("missing", f"/nonexistent/no-such-server-{uuid.uuid4().hex[:8]}"),
    }
    # Long enough for the fixture server to start; the silent ones fail after it.
    with anyio.fail_after(BOUND):
        async with open_client_pool(servers, connect_timeout=5.0) as pool:
            found: dict[str, tuple[types.Tool, ...] | DownstreamError] = {}
            together: list[bool] = []

            async def list_all() -> None:
                found.update(await pool.all_tools())

            def together_or_over() -> bool:
                # Started one after another, the two silent servers would never run at the same time.
                if marked_pids(silent_a) and marked_pids(silent_b):
                    together.append(True)
                return bool(together) or bool(found)

            async with anyio.create_task_group() as group:
                group.start_soon(list_all)
                await poll(together_or_over, interval=0.02)
    assert together, "the two silent servers never ran at the same time"
    assert list(found) == list(servers)
    good = found["good"]
    assert isinstance(good, tuple)
    assert {"echo", "add", "pid"} <= tool_names(good)
    for alias in ("silent_a", "silent_b", "missing"):
        failure = found[alias]
        assert isinstance(failure, DownstreamError)
        assert failure.server == alias


@pytest.mark.slow
async def test_leaving_the_pool_stops_its_servers_within_the_bound() -> None:
    servers = {"one": fixture_spec("one"), "two": fixture_spec("two")}
    with anyio.fail_after(BOUND):
        async with open_client_pool(servers, shutdown_timeout=5.0) as pool:
            pids = {await server_pid(pool, "one"), await server_pid(pool, "two")}
            assert len(pids) == 2
            assert all(exists(pid) for pid in pids)
    with anyio.fail_after(10.0):
        await wait_until_gone(pids)


async def test_an_http_server_on_a_closed_port_is_a_downstream_error_not_a_hang() -> None:
    # Bound but not listening: a connection is refused, and no other process can take the port.
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as closed:
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
        spec = ServerSpec(alias="web", name="web", source=Path("t.json"), url=f"http://127.0.0.1:{port}/mcp")
        # Well under connect_timeout: the refusal must end the attempt, not the timeout.
        with anyio.fail_after(10.0):
            async with open_client_pool({"web": spec}, connect_timeout=BOUND) as pool:
                with pytest.raises(DownstreamError) as caught:
                    await pool.tools("web")
    assert caught.value.server == "web"


def test_a_server_that_keeps_breaking_is_started_again_after_a_growing_bounded_pause() -> None:
    delays = [restart_delay(breaks) for breaks in range(1, 12)]
    assert delays[0] == 0.0  # the first break: the next call just works
    assert all(earlier < later for earlier, later in itertools.pairwise(delays[1:7]))
    assert max(delays) == delays[-1] <= 30.0


async def test_invalid_utf8_from_a_server_fails_that_call_and_the_next_call_restarts_it() -> None:
    with anyio.fail_after(BOUND):
        async with open_client_pool({"fixture": fixture_spec()}) as pool:
            first = await server_pid(pool, "fixture")
            with pytest.raises(DownstreamError, match="not valid UTF-8") as caught:
                await pool.call("fixture", "garble", {"kind": "invalid-utf8"})
            assert (caught.value.server, caught.value.tool) == ("fixture", "garble")
            assert await server_pid(pool, "fixture") != first
