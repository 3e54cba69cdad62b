"""A rolling restart of three replicas under a workload loses no variable parked before it began (issue 48).

Real server processes on loopback sharing a PostgreSQL database and a SeaweedFS store: each
replica in turn is stopped (SIGTERM: its drain parks its idle sessions and gives their leases
back) and started again, while a workload keeps opening conversations on the others.
"""

from __future__ import annotations

import random
from pathlib import Path

import anyio
import pytest

from mcp_test_helpers import new_conversation, poll
from postgres_helpers import Cluster
from replica_helpers import Replica, call, replicas
from s3_helpers import objects, s3_env, store_url

pytestmark = [pytest.mark.e2e, pytest.mark.anyio, pytest.mark.slow]

_PARKED = 6


async def _workload(fleet: list[Replica], done: anyio.Event, ran: list[str]) -> None:
    """New conversations, one after another, each on the next replica; a call to a stopped one fails."""
    turn = 0
    while not done.is_set():
        replica, turn = fleet[turn % len(fleet)], turn + 1
        try:
            result = await call(
                replica, "run_python", {"code": "k = 1\nprint(k)", "conversationId": new_conversation()}
            )
        except Exception:  # the replica is being restarted: the balancer would send the next call elsewhere
            await anyio.sleep(0.1)
            continue
        ran.append((result.structured_content or {}).get("status", "?"))


async def test_a_rolling_restart_of_three_replicas_under_a_workload_loses_no_parked_variable(
    postgres: Cluster, s3_endpoint: str, sandbox_runtime: Path | None
) -> None:
    url, prefix = postgres.create_database(), store_url()
    env = {
        **s3_env(s3_endpoint),
        "MCP_SANDBOX_OBJECT_STORE_URL": prefix,
        "MCP_SANDBOX_REPLICA_LEASE": "600",  # only a clean stop gives a lease back: no takeover by expiry
        "MCP_SANDBOX_SESSION_PARK_AFTER": "1",
    }

    def stored() -> int:
        return sum(name.startswith("parked/") for name in objects(s3_endpoint, prefix))

    async with replicas(3, url, sandbox_runtime, **env) as fleet:
        own = {new_conversation(): index for index in range(_PARKED)}
        for conversation, index in own.items():
            code = f"mine, name = {index}, {conversation!r}\nrows = [{{'i': i}} for i in range({index})]"
            made = await call(fleet[index % 3], "run_python", {"code": code, "conversationId": conversation})
            assert made.structured_content is not None and made.structured_content["status"] == "success", made
        with anyio.fail_after(90):
            await poll(lambda: stored() >= _PARKED)

        ran: list[str] = []
        done = anyio.Event()
        async with anyio.create_task_group() as work:
            work.start_soon(_workload, fleet, done, ran)
            for replica in fleet:  # the rollout: one at a time, each back before the next goes
                assert await replica.stop() == 0
                await replica.restart()
            done.set()

        order = list(own)
        random.Random(48).shuffle(order)
        resumed = []
        for turn, conversation in enumerate(order):
            result = await call(
                fleet[turn % 3],
                "run_python",
                {"code": "print(mine, name, len(rows))", "conversationId": conversation},
                90,
            )
            resumed.append((conversation, result.structured_content or {}))

    assert ran and "success" in ran  # the workload ran during the rollout
    for conversation, after in resumed:
        index = own[conversation]
        assert (after.get("status"), after.get("stdout")) == ("success", f"{index} {conversation} {index}\n"), after
        assert after["session"] == "resumed" and "stateLost" not in after
