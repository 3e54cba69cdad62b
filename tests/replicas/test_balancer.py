"""Three replicas behind the load balancer docs/scaling.md shows: any of them answers any call.

The 2026-07-28 protocol carries no session, so round-robin spreads one client's calls over every
replica; a handshake-era client keeps its Streamable HTTP session because the balancer sticks on
the session header. Each replica's own ``/metrics`` says how many runs it served.
"""

from __future__ import annotations

import anyio
import httpx2
import pytest

from balancer_helpers import ReplicaSet
from mcp_test_helpers import CALL_BOUND, structured

pytestmark = [pytest.mark.e2e, pytest.mark.sandbox, pytest.mark.anyio]

RUNS = 6


async def test_runs_and_list_runners_through_the_balancer_land_on_every_replica(balanced: ReplicaSet) -> None:
    before = await balanced.runs()
    async with balanced.client() as client:
        for index in range(RUNS):
            with anyio.fail_after(CALL_BOUND):
                result = await client.call_tool("run_python", {"code": f"print({index} * 7)"})
            assert not result.is_error, result
            assert structured(result)["stdout"] == f"{index * 7}\n"
            with anyio.fail_after(CALL_BOUND):
                runners = await client.call_tool("list_runners", {})
            assert not runners.is_error, runners
            assert "python" in str(structured(runners))
    after = await balanced.runs()
    served = {name: after[name] - before.get(name, 0) for name in after}
    assert sum(served.values()) == RUNS
    assert all(count >= 1 for count in served.values()), served
    assert len(served) == len(balanced.replicas) == 3


async def test_a_handshake_era_session_stays_on_the_replica_that_made_it(balanced: ReplicaSet) -> None:
    # Without the balancer's stickiness the second request would reach a replica that does not
    # know the session and be refused (404).
    before = await balanced.runs()
    async with balanced.client(mode="legacy") as client:
        for index in range(RUNS):
            with anyio.fail_after(CALL_BOUND):
                result = await client.call_tool("run_python", {"code": f"print({index})"})
            assert not result.is_error, result
    after = await balanced.runs()
    served = {name: after[name] - before.get(name, 0) for name in after}
    assert sorted(served.values()) == [0, 0, RUNS], served


async def test_a_replica_killed_with_sigkill_loses_no_call_and_takes_calls_again_once_restarted(
    balanced: ReplicaSet,
) -> None:
    victim = balanced.replicas[1]
    await victim.kill()
    # At once, before any health check has seen it go: the balancer retries the refused
    # connection on another replica (retries, option redispatch), so no call fails.
    async with balanced.client() as client:
        for index in range(RUNS):
            with anyio.fail_after(CALL_BOUND):
                result = await client.call_tool("run_python", {"code": f"print({index})"})
            assert not result.is_error, result
            assert structured(result)["stdout"] == f"{index}\n"
    await victim.start()
    before = (await balanced.runs())[victim.name]
    assert before == 0  # a new process: its counters start afresh
    with anyio.fail_after(CALL_BOUND):
        async with balanced.client() as client:
            while (await balanced.runs())[victim.name] == 0:
                result = await client.call_tool("run_python", {"code": "print('back')"})
                assert not result.is_error, result
                await anyio.sleep(0.2)  # the balancer's checks (rise 2, inter 2s) bring it back


async def test_the_balancer_answers_the_replicas_internal_route_itself(balanced: ReplicaSet) -> None:
    # Straight to a replica, an unsigned call is refused by the route (401); through the balancer
    # it never reaches one.
    async with httpx2.AsyncClient(timeout=CALL_BOUND) as web:
        direct = await web.post(f"{balanced.replicas[0].url}/internal/v1/call", content=b"{}")
        through = await web.post(f"{balanced.url}/internal/v1/call", content=b"{}")
        client_route = await web.get(f"{balanced.url}/readyz")
    assert direct.status_code == 401
    assert through.status_code == 404
    assert client_route.status_code == 200


async def test_a_replica_drained_on_the_runtime_api_gets_no_new_call(balanced: ReplicaSet) -> None:
    drained = balanced.replicas[0]
    assert balanced.admin(f"set server replicas/{drained.name} state drain").strip() == ""
    try:
        before = await balanced.runs()
        async with balanced.client() as client:
            for index in range(RUNS):
                with anyio.fail_after(CALL_BOUND):
                    result = await client.call_tool("run_python", {"code": f"print({index})"})
                assert not result.is_error, result
        after = await balanced.runs()
    finally:
        balanced.admin(f"set server replicas/{drained.name} state ready")
    served = {name: after[name] - before.get(name, 0) for name in after}
    assert served[drained.name] == 0 and sum(served.values()) == RUNS, served
