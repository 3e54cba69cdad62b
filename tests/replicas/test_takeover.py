"""A conversation taken over: the call forwarded to a frozen owner given up within the lease, the state loss said.

Real replicas sharing a PostgreSQL database (and a SeaweedFS store where files matter). An owner
stopped (SIGSTOP) keeps its connections open and answers nothing: a call forwarded to it waited
the whole read timeout of the hop (``max_timeout`` + 60 s), not the lease (issue 44, item 5). After
a takeover whose first call was an upload, the upload carried ``stateLost`` and the run that
followed, on a fresh interpreter, did not (item 6).
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from mcp_sandbox.replicas.leases import LAPSED_ELSEWHERE
from postgres_helpers import Cluster
from replica_helpers import Replica, call, lease_rows, replicas
from s3_helpers import s3_env, store_url

pytestmark = [pytest.mark.e2e, pytest.mark.anyio, pytest.mark.slow]

LEASE = 3.0


@contextlib.contextmanager
def frozen(replica: Replica) -> Iterator[None]:
    """The replica's server process stopped (SIGSTOP) for the block, continued at its end whatever happens."""
    os.kill(replica.process.pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(replica.process.pid, signal.SIGCONT)


async def run(replica: Replica, conversation: str, code: str, bound: float = 60.0) -> dict[str, Any]:
    result = await call(replica, "run_python", {"code": code, "conversationId": conversation}, bound)
    assert result.structured_content is not None, result
    structured: dict[str, Any] = result.structured_content
    return structured


async def test_a_call_forwarded_to_a_frozen_owner_is_taken_over_within_about_the_lease(
    postgres: Cluster, sandbox_runtime: Path | None
) -> None:
    url = postgres.create_database()
    async with replicas(2, url, sandbox_runtime, MCP_SANDBOX_REPLICA_LEASE=f"{LEASE:g}") as (owner, other):
        conversation = "conv-frozen-" + os.urandom(6).hex()
        await run(owner, conversation, "x = 1")
        with frozen(owner):
            assert {row[1] for row in lease_rows(url) if row[2] > time.time()} == {owner.url}  # forwarded to it
            started = time.monotonic()
            after = await run(other, conversation, "print('x' in globals())", bound=8 * LEASE)
            waited = time.monotonic() - started

    assert after["status"] == "success", after
    assert after["stdout"] == "False\n", after  # a fresh interpreter, on the replica that took it over
    assert after["stateLost"] is True, after
    assert waited < 6 * LEASE, waited  # the lease, a restore and a run: not max_timeout + 60 s


async def test_after_a_takeover_whose_first_call_is_an_upload_the_next_run_says_the_state_was_lost(
    postgres: Cluster, s3_endpoint: str, sandbox_runtime: Path | None
) -> None:
    url = postgres.create_database()
    env = {**s3_env(s3_endpoint), "MCP_SANDBOX_OBJECT_STORE_URL": store_url(), "MCP_SANDBOX_REPLICA_LEASE": "3"}
    async with replicas(2, url, sandbox_runtime, **env) as (owner, other):
        conversation = "conv-upload-first-" + os.urandom(6).hex()
        await run(owner, conversation, "x = 1")
        await owner.kill()
        arguments = {"conversationId": conversation, "filename": "a.txt", "content": "YQ=="}
        uploaded = await call(other, "upload_file", arguments, 8 * LEASE)  # waits out the lease, takes it over
        after = await run(other, conversation, "print('x' in globals(), open('/workspace/a.txt').read())")
        again = await run(other, conversation, "x = 2")

    assert not uploaded.is_error, uploaded
    assert "stateLost" not in (uploaded.structured_content or {}), uploaded  # an upload has no interpreter
    assert after["stdout"] == "False a\n", after
    assert (after["stateLost"], after["stateLostReason"]) == (True, LAPSED_ELSEWHERE), after
    assert "stateLost" not in again, again  # said once
