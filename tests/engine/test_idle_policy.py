"""The idle policy (``engine/idle_policy.py``): what becomes of a session nobody uses.

Parking itself (its state resumed, sealed, refused when tampered) is driven through the tools in
``tests/e2e/conversations/test_park.py``.
"""

from __future__ import annotations

import uuid

import anyio
import pytest

from mcp_sandbox.config import SessionSettings, WorkspaceSettings
from mcp_sandbox.engine.idle_policy import IdlePolicy
from mcp_sandbox.engine.session_state import Session

from .conftest import RunningEngine
from .helpers import HOST_BOUND, execute, poll, spawn_marked, wait_until_gone

pytestmark = pytest.mark.anyio


async def test_the_reaper_drops_an_unused_session_at_its_ttl_and_leaves_a_used_one() -> None:
    table: dict[str, Session] = {}
    now = anyio.current_time()
    table["idle"], table["used"] = Session("idle", now), Session("used", now, users=1)
    policy = IdlePolicy(SessionSettings(session_ttl=0.05), WorkspaceSettings(), table)
    assert not policy.parks(table["idle"])  # no parked states: stopped, never parked
    with anyio.fail_after(HOST_BOUND):
        async with anyio.create_task_group() as group:
            group.start_soon(policy.reap, group)
            await poll(lambda: "idle" not in table)
            group.cancel_scope.cancel()
    assert set(table) == {"used"}


@pytest.mark.sandbox
async def test_an_idle_session_is_stopped_after_its_ttl_and_the_next_run_starts_fresh(
    running_engine: RunningEngine,
) -> None:
    marker = f"session-ttl-{uuid.uuid4().hex}"
    async with running_engine(session_ttl=0.3) as engine:
        await execute(engine, spawn_marked(marker) + "\nkept = 1", session="s")
        with anyio.fail_after(HOST_BOUND):
            await poll(lambda: engine.live_sessions() == set())
        assert await wait_until_gone(marker) == []
        after = await execute(engine, "print('kept' in globals())", session="s")

    assert (after.session, after.stdout) == ("new", "False\n")
