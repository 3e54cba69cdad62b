"""Parked sessions with replicas (issue 48): a park is copied to the object store, and a replica
taking a conversation over after its owner's kill -9 resumes the last parked state from there;
one altered in the store is refused, never loaded (a variable whose unpickling would write a file
is never built).

Real server processes on loopback sharing a PostgreSQL database and a SeaweedFS store.
"""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest

from mcp_test_helpers import new_conversation, poll
from postgres_helpers import Cluster
from replica_helpers import call, replicas
from s3_helpers import objects, put_object, s3_env, store_url

pytestmark = [pytest.mark.e2e, pytest.mark.anyio, pytest.mark.slow]

# Unpickled, it writes a file into the conversation's workspace.
_TRIPWIRE = """
class Tripwire:
    def __reduce__(self):
        return (eval, ("open('/workspace/unpickled.txt', 'a').write('built')",))
tripwire = Tripwire()
"""


async def test_a_replica_taking_over_after_the_owners_kill_resumes_its_last_parked_state_and_refuses_an_altered_one(
    postgres: Cluster, s3_endpoint: str, sandbox_runtime: Path | None
) -> None:
    url, prefix, lease = postgres.create_database(), store_url(), 4.0
    env = {
        **s3_env(s3_endpoint),
        "MCP_SANDBOX_OBJECT_STORE_URL": prefix,
        "MCP_SANDBOX_REPLICA_LEASE": f"{lease:g}",
        "MCP_SANDBOX_SESSION_PARK_AFTER": "1",
    }

    def stored() -> list[str]:
        return [name for name in objects(s3_endpoint, prefix) if name.startswith("parked/")]

    async with replicas(2, url, sandbox_runtime, **env) as (owner, other):
        conversation, altered = new_conversation(), new_conversation()
        code = "class Box:\n    def __init__(self, n):\n        self.n = n\nbox = Box(41)\n"
        code += "open('f.txt', 'w').write('kept')"
        made = await call(owner, "run_python", {"code": code, "conversationId": conversation})
        assert made.structured_content is not None and made.structured_content["status"] == "success", made
        with anyio.fail_after(60):
            await poll(lambda: len(stored()) == 1)
        first = stored()[0]
        await call(owner, "run_python", {"code": "secret = 'original'" + _TRIPWIRE, "conversationId": altered})
        with anyio.fail_after(60):
            await poll(lambda: len(stored()) == 2)
        [second] = [name for name in stored() if name != first]
        body = bytearray(objects(s3_endpoint, prefix)[second])
        body[-1] ^= 0x01  # the seal's tag: the snapshot, tripwire and all, is intact
        put_object(s3_endpoint, prefix, second, bytes(body))

        await owner.kill()
        result = await call(
            other,
            "run_python",
            {"code": "print(box.n + 1, open('f.txt').read())", "conversationId": conversation},
            lease + 60,
        )
        after = result.structured_content or {}
        refused = await call(other, "run_python", {"code": "print(secret)", "conversationId": altered})
        denied = refused.structured_content or {}
        looked = await call(
            other,
            "run_python",
            {"code": "import os\nprint(os.path.exists('unpickled.txt'))", "conversationId": altered},
        )
        built = (looked.structured_content or {}).get("stdout")

        assert (after.get("status"), after.get("stdout")) == ("success", "42 kept\n"), after
        assert after["session"] == "resumed"
        assert "stateLost" not in after  # nothing was lost: no run came after the park
        assert (denied.get("status"), "failed its integrity check" in denied.get("error", "")) == ("error", True)
        assert built == "False\n"  # nothing of the altered state was built
        assert second not in stored()  # refused: deleted from the store too (and nothing started to park again)


async def test_a_replica_stopped_cleanly_parks_its_sessions_before_it_gives_their_leases_back(
    postgres: Cluster, s3_endpoint: str, sandbox_runtime: Path | None
) -> None:
    url, prefix = postgres.create_database(), store_url()
    env = {**s3_env(s3_endpoint), "MCP_SANDBOX_OBJECT_STORE_URL": prefix, "MCP_SANDBOX_REPLICA_LEASE": "600"}
    async with replicas(2, url, sandbox_runtime, **env) as (owner, other):
        conversation = new_conversation()
        made = await call(owner, "run_python", {"code": "total = sum(range(10))", "conversationId": conversation})
        assert made.structured_content is not None and made.structured_content["status"] == "success", made

        assert await owner.stop() == 0  # a rollout: SIGTERM, the drain, the leases given back at once
        result = await call(other, "run_python", {"code": "print(total)", "conversationId": conversation}, 60)
        after = result.structured_content or {}

        assert (after.get("status"), after.get("stdout"), after.get("session")) == ("success", "45\n", "resumed")
        assert "stateLost" not in after
