"""A burst of new conversations: the session-ready pool grows with them (within the budget of every uid),
refills all at once, serves the next burst from ready sandboxes, and shrinks back once they stop.

Each run's ``path`` says whether its session was born of a session-ready sandbox (``born``), so
these tests cannot pass on sessions started from nothing.
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path
from typing import Any

import anyio
import pytest

from mcp_sandbox.engine import Engine, ready, ready_sizing
from mcp_sandbox.engine.ready import ReadyPool
from mcp_sandbox.engine.ready_sizing import Arrivals, Mix, ReadyBudget

from .conftest import RunningEngine
from .helpers import execute, poll

# No warm pool beside them; one ready sandbox kept, three more allowed for bursts.
_FLAGS: dict[str, Any] = {"pool_size": 0, "pool_min": 0, "session_ready": 1, "session_ready_burst": 3}


def _conversation(engine: Engine, root: Path) -> Path:
    """A new conversation's directory as the workspace store makes one (0700, the sandbox uid's)."""
    directory = root / f"conversation-{uuid.uuid4().hex[:8]}"
    directory.mkdir(mode=0o700)
    if os.geteuid() == 0:
        os.chown(directory, engine.settings.sandbox.sandbox_uid, engine.settings.sandbox.sandbox_gid)
    return directory


async def _burst(engine: Engine, root: Path, count: int) -> list[str]:
    """``count`` new conversations' first runs back to back; the path each took."""
    paths = []
    for _ in range(count):
        workspace = _conversation(engine, root)
        result = await execute(engine, "print(1)", session=workspace.name, workspace=workspace)
        assert (result.status, result.session, result.stdout) == ("success", "new", "1\n"), result
        paths.append(result.path)
    return paths


async def _wait_idle(engine: Engine, count: int) -> None:
    with anyio.fail_after(90):  # sandbox starts on a loaded machine
        await poll(lambda: engine.ready.idle >= count)


@pytest.mark.sandbox
@pytest.mark.anyio
async def test_a_burst_grows_the_pool_at_once_within_the_budget_and_the_next_burst_is_all_born(
    running_engine: RunningEngine, state_dir: Path
) -> None:
    async with running_engine(**_FLAGS) as engine:
        engine.ready.wake()
        await _wait_idle(engine, 1)
        first = await _burst(engine, state_dir, 5)
        assert first[0] == "born"
        # Five came: the pool wants five, the budget gives it three above its floor, all started at once.
        assert (engine.ready.target, engine.ready.stock, engine.ready_pools.budget.used) == (5, 4, 3)

        await _wait_idle(engine, 4)
        assert await _burst(engine, state_dir, 4) == ["born"] * 4
        await _wait_idle(engine, 4)  # refilled again, never past the budget
        assert (engine.ready.stock, engine.ready_pools.budget.used) == (4, 3)


@pytest.mark.sandbox
@pytest.mark.anyio
async def test_the_pool_shrinks_back_to_its_floor_once_new_conversations_stop(
    running_engine: RunningEngine, state_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(ready_sizing, "RATE_WINDOW", 1.0)
    async with running_engine(**_FLAGS) as engine:
        engine.ready.wake()
        await _wait_idle(engine, 1)
        await _burst(engine, state_dir, 2)
        assert (engine.ready.stock, engine.ready_pools.budget.used) == (2, 1)  # grown for the next burst
        with anyio.fail_after(30):  # the window passes, then the trim (every half window)
            await poll(lambda: engine.ready.stock == 1 and engine.ready.idle == 1)
        assert engine.ready_pools.budget.used == 0


def test_arrivals_count_only_their_window_and_the_budget_has_room_below_its_limit() -> None:
    now = [100.0]
    arrivals = Arrivals(window=10.0, clock=lambda: now[0])
    for moment in (100.0, 105.0, 109.0):
        now[0] = moment
        arrivals.arrive()
    assert arrivals.recent() == 3
    now[0] = 112.0
    assert arrivals.recent() == 2  # the one at 100 is older than 10 s
    assert (ReadyBudget(2, used=1).room, ReadyBudget(2, used=2).room, ReadyBudget(0).room) == (True, False, False)


@pytest.mark.sandbox
@pytest.mark.anyio
async def test_a_pool_whose_burst_has_passed_replaces_its_claimed_preloading_sandbox(
    running_engine: RunningEngine, state_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A burst of light first runs grew the pool with light sandboxes; once it has passed (the
    # arrivals' clock moved on), a run naming a preloaded module claims the one preloading
    # sandbox, and the stock is at its target. Its replacement must still be a preloading one,
    # or a fork's first run later imports the modules itself.
    now = [1000.0]
    monkeypatch.setattr(ready, "Arrivals", lambda: Arrivals(clock=lambda: now[0]))
    monkeypatch.setattr(ready_sizing, "RATE_WINDOW", 3600.0)  # no trim during the test
    preloaded = "import sys\nprint('colorsys' in sys.modules)\n"  # names it: a preloading sandbox is asked for
    flags = {**_FLAGS, "session_ready": 2, "session_ready_burst": 2, "pool_preload": "colorsys"}
    async with running_engine(**flags) as engine:
        engine.ready.wake()
        await _wait_idle(engine, 2)  # one of each kind
        for _ in range(3):  # each takes the light one; the third grows the pool by one, light
            assert await _burst(engine, state_dir, 1) == ["born"]
            await _wait_idle(engine, engine.ready.target)
        assert (engine.ready.target, engine.ready.stock) == (3, 3)
        now[0] += ready_sizing.RATE_WINDOW + 1  # the burst has passed: the target is the floor again
        first = await execute(engine, preloaded, session="a", workspace=_conversation(engine, state_dir))
        await _wait_idle(engine, 2)
        second = await execute(engine, preloaded, session="b", workspace=_conversation(engine, state_dir))

    assert (first.path, first.stdout) == ("born", "True\n"), first
    assert (second.path, second.stdout) == ("born", "True\n"), second  # a light one had been kept instead


def test_the_floors_mix_holds_both_kinds_and_says_which_one_lacks_or_may_go() -> None:
    mix = Mix(floor=2)  # one preloading, one light
    assert mix.lacking() is True
    mix.add(True)
    assert mix.lacking() is False
    mix.add(False)
    mix.add(False)  # a burst's
    assert (mix.lacking(), mix.surplus(True), mix.surplus(False)) == (None, False, True)
    mix.remove(True)  # the preloading one claimed
    assert (mix.lacking(), mix.surplus(False)) == (True, True)
    assert (Mix(floor=1).lacking(), Mix(floor=0).lacking()) == (True, None)
    three = Mix(floor=3)
    three.add(True)
    three.add(False)
    assert three.lacking() is True  # two preloading, one light


@pytest.mark.sandbox
@pytest.mark.anyio
@pytest.mark.skipif(os.geteuid() != 0, reason="tenants get host uids of their own only from a root server")
async def test_one_tenants_burst_takes_the_budget_and_anothers_pool_keeps_only_its_floor(
    running_engine: RunningEngine, state_dir: Path
) -> None:
    flags = {**_FLAGS, "session_ready_burst": 2, "tenant_concurrent_runs": 1}
    async with running_engine(**flags) as engine:
        uids = engine.tenant_uids

        async def burst(tenant: str, count: int) -> None:
            for _ in range(count):
                workspace = state_dir / f"{tenant}-{uuid.uuid4().hex[:8]}"
                workspace.mkdir(mode=0o700)
                os.chown(workspace, uids.uid(tenant), engine.settings.sandbox.sandbox_gid)
                result = await execute(engine, "print(1)", session=workspace.name, workspace=workspace, tenant=tenant)
                assert (result.status, result.session) == ("success", "new"), result

        def pool(tenant: str) -> ReadyPool:
            found = engine.ready_pools.of(uids.uid(tenant))
            assert found is not None, f"{tenant}'s uid has no session-ready pool"
            return found

        await burst("alice", 4)  # her first makes her uid's pool; four came: it wants four
        alice = pool("alice")
        assert (alice.target, alice.stock, engine.ready_pools.budget.used) == (4, 3, 2)  # floor 1 + the budget
        await burst("bob", 3)
        bob = pool("bob")
        assert (bob.target, bob.stock) == (3, 1)  # the budget is alice's until her extra sandboxes are claimed or stop
        assert engine.ready_pools.budget.used == 2
