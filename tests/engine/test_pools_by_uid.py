"""Warm and pre-started sandboxes per host uid: each tenant's runs take the fast paths, as its own uid,
and a sandbox of one tenant's uid never serves another; an idle tenant's pools are retired.

As root only: where the server is not root, every tenant runs as one uid and shares its pools.
"""

from __future__ import annotations

import os
import uuid
from typing import Any

import anyio
import pytest

from mcp_sandbox.config import load_settings
from mcp_sandbox.engine import Engine, ExecutionResult
from mcp_sandbox.engine.pools_by_uid import UidPools
from mcp_sandbox.engine.runtimes import js_binary
from mcp_test_helpers import host_uid

from .conftest import RunningEngine
from .helpers import execute, host_processes, poll

pytestmark = [
    pytest.mark.sandbox,
    pytest.mark.anyio,
    pytest.mark.skipif(os.geteuid() != 0, reason="tenants get host uids of their own only from a root server"),
]

# One warm sandbox per tenant (its cap of concurrent runs), nothing preloaded (fast); the default
# uid's pool keeps one of its own, there to be (wrongly) taken.
_FLAGS: dict[str, Any] = {
    "pool_size": 2,
    "pool_min": 1,
    "pool_preload": "",
    "tenant_concurrent_runs": 1,
    "timeout": 10.0,
    "js_runtime": "bun",
}

_PYTHON = """
import subprocess
subprocess.run(["/bin/sh", "-c", "sleep 2; true", {marker!r}], check=True)
print("done")
"""
_TYPESCRIPT = """
import { spawnSync } from "node:child_process";
spawnSync("/bin/sh", ["-c", "sleep 2; true", {marker}]);
console.log("done");
"""


def _uid_processes(uid: int) -> list[int]:
    """Host processes whose real uid is ``uid``."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if host_uid(int(entry)) == uid:
                    found.append(int(entry))
            except (OSError, StopIteration):  # exited while we looked
                continue
    return found


async def _run_as(engine: Engine, tenant: str, language: str = "python") -> tuple[ExecutionResult, int]:
    """Run, as ``tenant``, code whose child the host finds by a marker; the result and the child's host uid."""
    marker = f"uidpool-{uuid.uuid4().hex}"
    code = (_PYTHON if language == "python" else _TYPESCRIPT).replace("{marker!r}", repr(marker))
    code = code.replace("{marker}", repr(marker))
    seen: list[int] = []
    outcome: list[ExecutionResult] = []

    async def run() -> None:
        outcome.append(await execute(engine, code, language=language, tenant=tenant, time_limit=10.0))

    async def look() -> None:
        await poll(lambda: bool(host_processes(marker)))
        seen.append(host_uid(host_processes(marker)[0]))

    with anyio.fail_after(60):
        async with anyio.create_task_group() as group:
            group.start_soon(run)
            group.start_soon(look)
    (result,) = outcome
    assert result.exit_code == 0 and result.stdout.strip() == "done", result
    return result, seen[0]


async def _pools(engine: Engine, tenant: str) -> tuple[int, UidPools]:
    uid = engine.tenant_uids.uid(tenant)  # as the engine gave it (kept in the state directory)
    assert uid != engine.settings.sandbox.sandbox_uid
    pools = engine.pools.of(uid)
    assert pools is not None, f"{tenant}'s uid has no pools"
    return uid, pools


async def test_each_tenants_python_runs_are_served_warm_as_its_own_uid(running_engine: RunningEngine) -> None:
    async with running_engine(**_FLAGS) as engine:
        with anyio.fail_after(60):
            await poll(lambda: engine.pool.idle >= 1)  # the default uid's warm sandbox is there
        for tenant in ("alice", "bob"):
            await _run_as(engine, tenant)  # the first makes the uid's pools
            uid, pools = await _pools(engine, tenant)
            with anyio.fail_after(60):
                await poll(lambda pools=pools: pools.warm.idle >= 1)  # type: ignore[misc]
            result, seen = await _run_as(engine, tenant)
            assert result.path == "warm", result
            assert seen == uid
            assert pools.warm.size == 1  # its cap: tenant_concurrent_runs
        assert engine.pool.idle == 1  # the default uid's sandbox served neither
        # The gauges count every uid's sandboxes.
        assert engine.pools.warm_size == engine.pool.size + 2


async def test_a_warm_sandbox_of_one_tenants_uid_never_serves_another(running_engine: RunningEngine) -> None:
    async with running_engine(**_FLAGS) as engine:
        await _run_as(engine, "alice")
        alice_uid, alice = await _pools(engine, "alice")
        with anyio.fail_after(60):
            await poll(lambda: alice.warm.idle >= 1 and engine.pool.idle >= 1)

        result, seen = await _run_as(engine, "bob")  # idle warm sandboxes of alice's uid and the default's

        bob_uid, bob = await _pools(engine, "bob")
        assert result.path == "fresh", result  # bob's own pool was only just made
        assert seen == bob_uid != alice_uid
        assert alice.warm.idle == 1 and engine.pool.idle == 1  # neither was taken
        assert bob is not alice and bob.warm.uid == bob_uid and alice.warm.uid == alice_uid
        assert _uid_processes(alice_uid)  # her warm sandbox, idle

    # Every uid's pools stop with the engine.
    with anyio.fail_after(10):
        await poll(lambda: not _uid_processes(alice_uid) and not _uid_processes(bob_uid))


async def test_each_tenants_typescript_runs_take_prestarted_sandboxes_of_its_own_uid(
    running_engine: RunningEngine,
) -> None:
    binary = js_binary(load_settings(env={}, flags={}).paths, "bun")
    if not os.access(binary, os.X_OK):
        pytest.skip(f"bun is not installed at {binary}: run `make runtime`")
    async with running_engine(**_FLAGS, prestart_size=2) as engine:
        for tenant in ("alice", "bob"):
            result, seen = await _run_as(engine, tenant, "typescript")
            uid, pools = await _pools(engine, tenant)
            assert result.path == "prestarted", result  # its first run waited for one of its own
            assert seen == uid
            with anyio.fail_after(60):
                await poll(lambda pools=pools: pools.prestart.ready("typescript") >= 1)  # type: ignore[misc]
            result, seen = await _run_as(engine, tenant, "typescript")
            assert (result.path, seen) == ("prestarted", uid)
            assert pools.prestart.size("typescript") == 1  # its cap: tenant_concurrent_runs
        assert engine.prestart.size("typescript") == 0  # the default uid's never started: no run of its came


async def test_an_idle_tenants_pools_are_retired_and_their_sandboxes_stopped(running_engine: RunningEngine) -> None:
    async with running_engine(**_FLAGS, pool_idle="2s") as engine:
        await execute(engine, "print(1)", tenant="alice")  # makes her uid's pools
        uid, pools = await _pools(engine, "alice")
        with anyio.fail_after(60):
            await poll(lambda: pools.warm.idle >= 1)
        assert _uid_processes(uid), "alice's warm sandbox runs as her uid"

        with anyio.fail_after(30):  # pool_idle after her last run, checked every second
            await poll(lambda: engine.pools.of(uid) is None and not _uid_processes(uid))

        assert engine.pool.size == 1  # the default uid's pool keeps its pool_min
        await execute(engine, "print(1)", tenant="alice")  # her next run makes her pools again
        assert engine.pools.of(uid) is not None
