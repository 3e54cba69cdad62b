"""Session-ready sandboxes per host uid: each tenant's new sessions are born of ready sandboxes of
its own uid, a ready sandbox of one tenant's uid never serves another, and an idle tenant's pool is
retired.

A run says whether its interpreter is a session-ready sandbox's runner (``boot.py --ready=...``);
the host owner of the file it writes is the host uid it ran as. As root only: where the server is
not root, every tenant runs as one uid and shares one pool.
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path
from typing import Any

import anyio
import pytest

from mcp_sandbox.engine import Engine, ExecutionResult
from mcp_sandbox.engine.ready import ReadyPool

from .conftest import RunningEngine
from .helpers import execute, poll

pytestmark = [
    pytest.mark.sandbox,
    pytest.mark.anyio,
    pytest.mark.skipif(os.geteuid() != 0, reason="tenants get host uids of their own only from a root server"),
]

# One ready sandbox per uid; no warm pool to hold memory beside them.
_FLAGS: dict[str, Any] = {"pool_size": 0, "pool_min": 0, "tenant_concurrent_runs": 1, "session_ready": 2}
_PROBE = """
import os
born = b'--ready=' in open('/proc/self/cmdline', 'rb').read()
print(born, sorted(os.listdir('/workspace')))
open('/workspace/mine', 'w').write('x')
"""


def _uid(engine: Engine, tenant: str) -> int:
    return engine.tenant_uids.uid(tenant)  # as the engine gave it (kept in the state directory)


def _conversation(engine: Engine, root: Path, tenant: str) -> Path:
    """A new conversation's directory of ``tenant`` as the workspace store makes one (0700, its uid's)."""
    directory = root / f"{tenant}-{uuid.uuid4().hex[:8]}"
    directory.mkdir(mode=0o700)
    os.chown(directory, _uid(engine, tenant), engine.settings.sandbox.sandbox_gid)
    (directory / "given").write_text("given")
    return directory


async def _first_run(engine: Engine, root: Path, tenant: str) -> tuple[bool, int, ExecutionResult]:
    """A new conversation's first run as ``tenant``: whether it was born, the host uid it ran as, the result."""
    workspace = _conversation(engine, root, tenant)
    result = await execute(engine, _PROBE, session=workspace.name, workspace=workspace, tenant=tenant)
    assert result.status == "success", f"{result.status}: {result.error}\n{result.stderr}"
    born, listing = result.stdout.split(" ", 1)
    assert (result.session, listing.strip()) == ("new", "['given']")
    return born == "True", os.stat(workspace / "mine").st_uid, result  # written at the conversation's path


def _pool(engine: Engine, tenant: str) -> ReadyPool:
    pool = engine.ready_pools.of(_uid(engine, tenant))
    assert pool is not None, f"{tenant}'s uid has no session-ready pool"
    return pool


async def _wait_idle(pool: ReadyPool, count: int) -> None:
    with anyio.fail_after(60):
        await poll(lambda: pool.idle >= count)


async def test_each_tenants_new_sessions_are_born_of_ready_sandboxes_of_its_own_uid(
    running_engine: RunningEngine, state_dir: Path
) -> None:
    async with running_engine(**_FLAGS) as engine:
        born, uid, _ = await _first_run(engine, state_dir, "bob")  # makes bob's pool: started from nothing
        assert (born, uid) == (False, _uid(engine, "bob"))
        bob = _pool(engine, "bob")
        await _wait_idle(bob, 1)

        # Only bob's ready sandbox is idle: alice's first conversation run is not born of it.
        born, uid, _ = await _first_run(engine, state_dir, "alice")
        assert (born, uid) == (False, _uid(engine, "alice")) != (False, _uid(engine, "bob"))
        assert bob.idle == 1
        alice = _pool(engine, "alice")
        assert alice is not bob and (alice.uid, bob.uid) == (_uid(engine, "alice"), _uid(engine, "bob"))

        for tenant, pool in (("alice", alice), ("bob", bob)):
            await _wait_idle(pool, 1)
            born, uid, _ = await _first_run(engine, state_dir, tenant)
            assert (born, uid) == (True, _uid(engine, tenant))
        assert engine.ready.idle == 0  # the default uid's pool never started: no session of its came
        # A uid's floor is capped by tenant_concurrent_runs, below session_ready; above it the pool
        # grows only to the new conversations of the last seconds (alice's two), never further.
        assert alice.floor == 1
        await _wait_idle(alice, 1)
        assert 1 <= alice.idle <= 2


async def test_an_idle_tenants_ready_pool_is_retired_and_its_sandboxes_stopped(
    running_engine: RunningEngine, state_dir: Path
) -> None:
    async with running_engine(**_FLAGS, pool_idle="2s", session_ttl="1s") as engine:
        await _first_run(engine, state_dir, "alice")  # makes her uid's pool
        uid = _uid(engine, "alice")
        await _wait_idle(_pool(engine, "alice"), 1)
        born, seen, _ = await _first_run(engine, state_dir, "alice")
        assert (born, seen) == (True, uid)

        with anyio.fail_after(30):  # pool_idle after her last claim, checked every second; sessions end after 1 s
            await poll(lambda: engine.ready_pools.of(uid) is None and not _uid_processes(uid))

        born, seen, _ = await _first_run(engine, state_dir, "alice")  # her next conversation makes a new pool
        assert (born, seen) == (False, uid)
        assert engine.ready_pools.of(uid) is not None


async def test_a_session_born_of_a_retired_pool_lives_on_until_it_ends(
    running_engine: RunningEngine, state_dir: Path
) -> None:
    async with running_engine(**_FLAGS, pool_idle="2s") as engine:
        await _first_run(engine, state_dir, "alice")  # makes her uid's pool
        uid = _uid(engine, "alice")
        pool = _pool(engine, "alice")
        await _wait_idle(pool, 1)
        workspace = _conversation(engine, state_dir, "alice")
        first = await execute(engine, _PROBE + "kept = 41", session="kept", workspace=workspace, tenant="alice")
        assert first.stdout.startswith("True "), first  # born of her pool's sandbox

        with anyio.fail_after(30):  # retired (no claim for pool_idle): its idle sandbox stops, not the session
            await poll(lambda: engine.ready_pools.of(uid) is None and pool.idle == 0)
        later = await execute(engine, "print(kept + 1)", session="kept", workspace=workspace, tenant="alice")
        assert (later.session, later.stdout) == ("kept", "42\n")

        for key in engine.live_sessions():  # hers: this one and the first (started from nothing)
            assert await engine.end_session(key)
        with anyio.fail_after(30):  # the retired pool's last sandbox is gone with its session
            await poll(lambda: not _uid_processes(uid))


def _uid_processes(uid: int) -> list[int]:
    """Host processes whose real uid is ``uid``."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/status", encoding="ascii") as status:
                    line = next(line for line in status if line.startswith("Uid:"))
            except (OSError, StopIteration):  # exited while we looked
                continue
            if int(line.split()[1]) == uid:
                found.append(int(entry))
    return found
