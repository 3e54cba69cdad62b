"""How many sessions live, and what a session's interpreter may spend in all."""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import anyio
import pytest

from mcp_sandbox.engine import ExecutionResult
from mcp_sandbox.errors import BusyError

from .conftest import RunningEngine
from .helpers import HOST_BOUND, execute, host_processes, poll, spawn_marked

pytestmark = [pytest.mark.sandbox, pytest.mark.anyio]

MiB = 1 << 20


async def test_a_new_session_evicts_the_least_recently_used_idle_one(running_engine: RunningEngine) -> None:
    async with running_engine(max_sessions=2) as engine:
        for key in ("a", "b", "a"):  # "a" used last: "b" is the least recently used
            await execute(engine, f"kept = {key!r}", session=key)
        await execute(engine, "kept = 'c'", session="c")
        live = engine.live_sessions()
        evicted = await execute(engine, "print(globals().get('kept'))", session="b")

    assert live == {"a", "c"}
    assert (evicted.session, evicted.stdout) == ("new", "None\n")


async def test_a_tenant_over_its_session_cap_evicts_its_own_never_another_tenants(
    running_engine: RunningEngine,
) -> None:
    async with running_engine(max_sessions=3, tenant_sessions=2) as engine:
        await execute(engine, "kept = 'bob'", session="b1", tenant="bob")
        for key in ("a1", "a2", "a3", "a4"):
            await execute(engine, f"kept = {key!r}", session=key, tenant="alice")
        live = engine.live_sessions()
        bobs = await execute(engine, "print(kept)", session="b1", tenant="bob")

    assert live == {"b1", "a3", "a4"}
    assert (bobs.session, bobs.stdout) == ("kept", "bob\n")


async def test_a_new_session_is_refused_with_busy_error_when_every_session_is_busy(
    running_engine: RunningEngine,
) -> None:
    marker = f"session-busy-{uuid.uuid4().hex}"
    results: list[ExecutionResult] = []
    async with running_engine(max_sessions=1) as engine, anyio.create_task_group() as group:

        async def occupy() -> None:
            # Runs until the marked process is gone (the test kills the session to end it).
            code = spawn_marked(marker) + "\nmarked.wait()"
            results.append(await execute(engine, code, session="a", time_limit=30))

        group.start_soon(occupy)
        with anyio.fail_after(HOST_BOUND):
            await poll(lambda: bool(host_processes(marker)))
        with pytest.raises(BusyError):
            await execute(engine, "print(1)", session="b")
        fresh = await execute(engine, "print('fresh runs are not sessions')")
        await engine.end_session("a")

    assert fresh.stdout == "fresh runs are not sessions\n"
    assert results[0].status == "error"


async def test_a_session_that_used_up_its_cpu_seconds_is_reported_and_restarted(running_engine: RunningEngine) -> None:
    async with running_engine(session_cpu_seconds=2) as engine:
        await execute(engine, "kept = 1", session="s")
        spun = await execute(engine, "while True:\n    pass", session="s", time_limit=30)
        after = await execute(engine, "print('kept' in globals())", session="s")

    assert (spun.status, spun.session) == ("error", "kept")
    assert spun.error is not None and "SIGXCPU" in spun.error and "state is lost" in spun.error
    assert (after.session, after.stdout) == ("new", "False\n")


async def test_a_runs_cpu_limit_is_the_per_run_one_without_a_session(running_engine: RunningEngine) -> None:
    async with running_engine(session_cpu_seconds=1) as engine:
        # Two seconds of CPU: over the session's budget, well within a fresh run's.
        fresh = await execute(
            engine,
            "import time\nend = time.process_time() + 2\nwhile time.process_time() < end:\n    pass",
            time_limit=30,
        )

    assert fresh.status == "success", fresh.error


async def test_a_session_runs_file_size_limit_is_what_its_conversations_quota_has_left(
    running_engine: RunningEngine, state_dir: Path
) -> None:
    # A session's interpreter serves many runs: each lowers its own soft RLIMIT_FSIZE to what the
    # quota has left; the hard limit, which the code could raise its soft limit to, is the quota.
    workspace = state_dir / "conversation"
    limits = "import resource; print(*resource.getrlimit(resource.RLIMIT_FSIZE), flush=True)"
    async with running_engine(quota_bytes="8m") as engine:
        workspace.mkdir(mode=0o700)
        if os.geteuid() == 0:
            os.chown(workspace, engine.settings.sandbox.sandbox_uid, engine.settings.sandbox.sandbox_gid)
        first = await execute(
            engine, f"open('/workspace/a', 'wb').write(b'x' * {3 * MiB})\n{limits}", session="s", workspace=workspace
        )
        huge = await execute(
            engine,
            f"""
            {limits}
            chunk = b"x" * {MiB}
            with open("/workspace/huge", "wb") as out:
                for _ in range(64):
                    out.write(chunk)
            print("all written")
            """,
            session="s",
            workspace=workspace,
        )

    assert (first.status, first.stdout) == ("success", f"{8 * MiB} {8 * MiB}\n"), first.error
    assert huge.stdout == f"{5 * MiB} {8 * MiB}\n"
    assert huge.status == "error" and "file_size" in huge.limits
    assert huge.error is not None and "quota of 8 MiB" in huge.error and "state is lost" in huge.error
    assert (workspace / "huge").stat().st_size <= 5 * MiB
