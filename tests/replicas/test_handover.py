"""A conversation handed over when its owner goes, for real: server processes on loopback sharing a PostgreSQL database.

A killed owner is replaced within the lease time, the result saying the variables were lost; a
clean stop or a drain gives the leases back, so nothing waits; a replica that remembers a gone
owner finds the new one. Each test stops or kills a replica, with its own lease, so each starts
its own.
"""

from __future__ import annotations

import signal
import time
from pathlib import Path

import anyio
import httpx2
import pytest

from mcp_sandbox.replicas.leases import STOPPED
from mcp_test_helpers import new_conversation
from postgres_helpers import Cluster
from replica_helpers import (
    METRICS_TOKEN,
    call,
    lease_rows,
    owners,
    replicas,
    run,
    runs_running,
    structured_data,
    until,
)

pytestmark = [pytest.mark.e2e, pytest.mark.anyio, pytest.mark.slow]


async def test_a_killed_owner_is_replaced_within_the_lease_time_and_the_result_says_the_variables_were_lost(
    postgres: Cluster, sandbox_runtime: Path | None
) -> None:
    url = postgres.create_database()
    lease = 4.0
    async with replicas(2, url, sandbox_runtime, MCP_SANDBOX_REPLICA_LEASE=f"{lease:g}") as (owner, other):
        conversation = new_conversation()
        await run(owner, conversation, "x = 1")
        await run(other, conversation, "x += 1")  # forwarded: the owner keeps running it

        await owner.kill()
        after = await run(other, conversation, "print('x' in globals())", bound=lease + 60)

        assert after["status"] == "success", after
        assert after["stdout"] == "False\n"  # a fresh interpreter
        assert after["stateLost"] is True
        assert owners(url) == {other.url}
        kept = await run(other, conversation, "x = 5\nprint(x)")
        assert kept["stdout"] == "5\n" and "stateLost" not in kept


async def test_a_cleanly_stopped_replica_gives_its_leases_back_so_the_next_call_does_not_wait(
    postgres: Cluster, sandbox_runtime: Path | None
) -> None:
    url = postgres.create_database()
    lease = 600.0  # a call that waited for the lease to expire could not finish within the bound below
    async with replicas(2, url, sandbox_runtime, MCP_SANDBOX_REPLICA_LEASE=f"{lease:g}") as (owner, other):
        conversation = new_conversation()
        await run(owner, conversation, "x = 1")

        assert await owner.stop() == 0
        assert owners(url) == set()
        after = await run(other, conversation, "print('x' in globals())", bound=60)

        assert after["stdout"] == "False\n", after
        assert (after["stateLost"], after["stateLostReason"]) == (True, STOPPED)  # given back with its session
        assert owners(url) == {other.url}


async def test_a_call_forwarded_to_a_remembered_owner_that_is_gone_lands_on_the_new_owner(
    postgres: Cluster, sandbox_runtime: Path | None
) -> None:
    url = postgres.create_database()
    lease = 600.0  # the owner the forwarding replica remembers is not stale for the whole test
    async with replicas(3, url, sandbox_runtime, MCP_SANDBOX_REPLICA_LEASE=f"{lease:g}") as (first, second, third):
        conversation = new_conversation()
        await run(first, conversation, "x = 1")
        remembered = await run(second, conversation, "print(x)")  # forwarded: second remembers first

        assert await first.stop() == 0  # its lease given back
        await run(third, conversation, "x = 'on third'")  # third takes the lease
        after = await run(second, conversation, "print(x)", bound=60)

        assert remembered["stdout"] == "1\n", remembered
        assert after["stdout"] == "on third\n", after  # not first's (gone), and no wait for a lease
        assert owners(url) == {third.url}


async def test_a_draining_replica_hands_its_idle_conversations_over_at_once(
    postgres: Cluster, sandbox_runtime: Path | None
) -> None:
    url = postgres.create_database()
    env = {"MCP_SANDBOX_METRICS_TOKEN": METRICS_TOKEN, "MCP_SANDBOX_SHUTDOWN_GRACE": "120"}
    async with replicas(2, url, sandbox_runtime, **env) as (owner, other), httpx2.AsyncClient(timeout=30) as web:
        idle, busy = new_conversation(), new_conversation()
        await run(owner, idle, "x = 1")
        await run(owner, busy, "y = 1")

        async def started() -> bool:
            return await runs_running(web, owner) >= 1

        async def draining() -> bool:
            return (await web.get(f"{owner.url}/readyz")).status_code == 503

        async with anyio.create_task_group() as group:
            group.start_soon(run, owner, busy, "import time; time.sleep(120)", 180.0)
            await until(started, 60)
            owner.process.send_signal(signal.SIGTERM)  # the drain waits for the busy run
            await until(draining, 30)

            moved = await run(other, idle, "print('x' in globals())", bound=30)
            refused = await call(other, "run_python", {"code": "print(y)", "conversationId": busy}, 30)

            assert moved["stdout"] == "False\n" and moved["stateLost"] is True, moved  # given back with its session
            assert moved["stateLostReason"] == STOPPED, moved
            assert refused.is_error and "shutting down" in str(structured_data(refused).get("error")), refused
            assert {o for k, o, e, _ in lease_rows(url) if e > time.time()} == {owner.url, other.url}
            owner.process.send_signal(signal.SIGTERM)  # a second one: the busy run is stopped now
