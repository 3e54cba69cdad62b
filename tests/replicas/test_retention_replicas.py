"""Retention over replicas sharing one PostgreSQL database and one SeaweedFS store, for real.

Each replica's retention sweeps the tenant's conversations, and spares those another replica is
using: a tenant over its budget loses only the conversations no replica holds.
"""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest

from mcp_test_helpers import new_conversation, upload
from postgres_helpers import Cluster
from replica_helpers import TOKEN, replicas, run
from s3_helpers import files, s3_env, store_url

pytestmark = [pytest.mark.e2e, pytest.mark.anyio, pytest.mark.slow]


async def test_a_tenant_over_its_budget_loses_only_the_conversations_no_replica_is_using(
    postgres: Cluster, s3_endpoint: str, sandbox_runtime: Path | None
) -> None:
    # Each replica's retention spared only its own sessions and calls: a tenant over its budget had
    # the conversation another replica was running evicted, its files deleted from the store (issue 37).
    prefix = store_url()
    env = {
        **s3_env(s3_endpoint),
        "MCP_SANDBOX_OBJECT_STORE_URL": prefix,
        "MCP_SANDBOX_TENANT_WORKSPACES_BYTES": str(1 << 20),
        "MCP_SANDBOX_RETENTION_INTERVAL": "1",
        "MCP_SANDBOX_REPLICA_LEASE": "3",
    }
    async with replicas(2, postgres.create_database(), sandbox_runtime, **env) as (first, second):
        idle, on_first, on_second = new_conversation(), new_conversation(), new_conversation()
        assert (await upload(first.url, TOKEN, idle, "idle.bin", b"i" * (300 << 10))).status_code == 201
        await run(first, on_first, "x = 1\nopen('a.bin', 'wb').write(b'a' * (600 << 10))")
        await run(second, on_second, "y = 2\nopen('b.bin', 'wb').write(b'b' * (600 << 10))")

        def stored() -> set[str]:
            return {name.rsplit("/", 1)[-1] for name in files(s3_endpoint, prefix)}

        # 1.5 MiB over a budget of 1: the idle conversation goes once its lease is given back; the
        # two with a live session, each on its own replica, stay (nothing else can be evicted).
        with anyio.fail_after(60):
            while "idle.bin" in await anyio.to_thread.run_sync(stored):  # noqa: ASYNC110 - retention has no event
                await anyio.sleep(0.2)
            await anyio.sleep(2)  # the sweep that evicted it ends, and more sweeps of each replica run
        assert await anyio.to_thread.run_sync(stored) == {"a.bin", "b.bin"}
        kept = [await run(second, on_first, "print(x)"), await run(first, on_second, "print(y)")]
        assert [(r["stdout"], r["session"]) for r in kept] == [("1\n", "kept"), ("2\n", "kept")], kept
