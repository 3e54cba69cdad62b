"""A replica stalled past its lease in the middle of an upload records nothing when it wakes up.

Real replicas sharing a PostgreSQL database and a SeaweedFS store: the owner of a conversation is
stopped (SIGSTOP) while an upload's body is still coming, another replica takes the expired lease
and stores a file of its own, and the stalled one is continued (SIGCONT) and sent the rest of the
body. Before the writes were fenced by the lease's epoch, it stored the file beside the new
owner's, recorded its own listing over theirs and wrote it back: the conversation passed its quota
in the store (issue 37).
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import anyio
import httpx2
import psycopg
import pytest

from mcp_sandbox.replicas.indexing import STOP_BEFORE_INDEX
from mcp_test_helpers import new_conversation, upload
from postgres_helpers import Cluster
from replica_helpers import TOKEN, Replica, call, lease_rows, replicas
from s3_helpers import files, s3_env, store_url

pytestmark = [pytest.mark.e2e, pytest.mark.anyio, pytest.mark.slow]

QUOTA = 100 << 10
LEASE = 3.0
LIST = "import os; print(sorted(os.listdir('/workspace')))"


@contextlib.contextmanager
def stopped(replica: Replica) -> Iterator[None]:
    """The replica's server process stopped (SIGSTOP) for the block, continued at its end whatever happens."""
    os.kill(replica.process.pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(replica.process.pid, signal.SIGCONT)


async def wait_for(check: Callable[[], bool], bound: float) -> None:
    """Poll ``check()`` (a blocking function) from a worker thread until it is true, within ``bound`` seconds."""
    with anyio.fail_after(bound):
        while not await anyio.to_thread.run_sync(check):  # noqa: ASYNC110 - another process's state: no event
            await anyio.sleep(0.05)


def staged(replica: Replica) -> list[str]:
    """The files being uploaded to ``replica`` now (its ``uploads/`` directory)."""
    uploads = replica.state / "uploads"
    return sorted(os.listdir(uploads)) if uploads.is_dir() else []


def recorded_usage(database_url: str) -> list[tuple[int, int]]:
    with psycopg.connect(database_url, autocommit=True) as db:
        rows = db.execute("SELECT bytes, files FROM conversations").fetchall()
    return [(int(used), int(files)) for used, files in rows]


async def test_an_owner_stalled_past_its_lease_mid_upload_is_refused_and_the_quota_holds(
    postgres: Cluster, s3_endpoint: str, sandbox_runtime: Path | None
) -> None:
    url, prefix = postgres.create_database(), store_url()
    env = {
        **s3_env(s3_endpoint),
        "MCP_SANDBOX_OBJECT_STORE_URL": prefix,
        "MCP_SANDBOX_REPLICA_LEASE": f"{LEASE:g}",
        "MCP_SANDBOX_QUOTA_BYTES": str(QUOTA),
    }
    async with replicas(2, url, sandbox_runtime, **env) as (owner, other):
        conversation = new_conversation()
        assert (await upload(owner.url, TOKEN, conversation, "first.txt", b"1" * 1000)).status_code == 201
        rest = anyio.Event()

        async def slow_body() -> AsyncIterator[bytes]:
            yield b"s" * (30 << 10)
            await rest.wait()
            yield b"s" * (30 << 10)

        async def stalled_upload() -> httpx2.Response:
            headers = {"Authorization": f"Bearer {TOKEN}"}
            async with httpx2.AsyncClient(headers=headers, timeout=60, trust_env=False) as web:
                params = {"conversationId": conversation, "filename": "stalled.bin"}
                return await web.post(f"{owner.url}/upload", params=params, content=slow_body())

        replies: list[httpx2.Response] = []
        with anyio.fail_after(120):
            async with anyio.create_task_group() as group:

                async def send() -> None:
                    replies.append(await stalled_upload())

                group.start_soon(send)
                # The owner has claimed the lease, opened the file in uploads/ and waits for the rest of the body.
                await wait_for(lambda: staged(owner) != [], 30)
                with stopped(owner):
                    await wait_for(lambda: all(r[2] < time.time() for r in lease_rows(url)), 30)
                    taken = await upload(other.url, TOKEN, conversation, "second.bin", b"2" * (60 << 10))
                rest.set()  # the stalled owner, continued, receives the rest of its body
        stalled = replies[0]
        retried = await upload(owner.url, TOKEN, conversation, "stalled.bin", b"s" * (60 << 10))
        listed = await call(other, "run_python", {"conversationId": conversation, "code": LIST})
        stored = await anyio.to_thread.run_sync(files, s3_endpoint, prefix)

        assert taken.status_code == 201, taken.text
        assert stalled.status_code == 503, stalled.text  # the lease was lost: send it again
        assert retried.status_code == 413, retried.text  # sent again, it reaches the new owner: over the quota
        assert sorted(name.rsplit("/", 1)[-1] for name in stored) == ["first.txt", "second.bin"]
        assert sum(len(content) for content in stored.values()) <= QUOTA
        assert recorded_usage(url) == [(1000 + (60 << 10), 2)]
        assert listed.structured_content is not None, listed
        assert listed.structured_content["stdout"] == "['first.txt', 'second.bin']\n", listed
        assert staged(owner) == []  # the stalled file is gone from uploads/, never renamed into the workspace
        assert list(owner.state.rglob("stalled.bin")) == []


def stopped_by_itself(replica: Replica) -> bool:
    """Whether every thread of the replica's server process is stopped (``T`` in each
    ``/proc/<pid>/task/<tid>/stat``): the one that stopped itself, and the others with it."""
    states = []
    for task in Path(f"/proc/{replica.process.pid}/task").iterdir():
        with contextlib.suppress(FileNotFoundError):  # a thread that ended meanwhile
            states.append((task / "stat").read_text().rsplit(")", 1)[1].split()[0])
    return bool(states) and all(state == "T" for state in states)


async def test_an_owner_stalled_before_its_index_write_leaves_the_new_owners_index_and_files(
    postgres: Cluster, s3_endpoint: str, sandbox_runtime: Path | None
) -> None:
    url, prefix = postgres.create_database(), store_url()
    env = {
        **s3_env(s3_endpoint),
        "MCP_SANDBOX_OBJECT_STORE_URL": prefix,
        "MCP_SANDBOX_REPLICA_LEASE": f"{LEASE:g}",
        # The replica that writes back stalled.txt stops itself after its last fence check, before its index write.
        STOP_BEFORE_INDEX: "stalled.txt",
    }
    async with replicas(2, url, sandbox_runtime, **env) as (owner, other):
        conversation = new_conversation()
        assert (await upload(owner.url, TOKEN, conversation, "first.txt", b"1" * 1000)).status_code == 201
        replies: list[httpx2.Response] = []
        with anyio.fail_after(120):
            async with anyio.create_task_group() as group:

                async def send() -> None:
                    replies.append(await upload(owner.url, TOKEN, conversation, "stalled.txt", b"s" * 2000))

                group.start_soon(send)
                await wait_for(lambda: stopped_by_itself(owner), 30)
                try:
                    await wait_for(lambda: all(r[2] < time.time() for r in lease_rows(url)), 30)
                    taken = await upload(other.url, TOKEN, conversation, "second.txt", b"2" * 3000)
                finally:
                    os.kill(owner.process.pid, signal.SIGCONT)
        stalled = replies[0]
        acknowledged = {"first.txt", "second.txt"} | ({"stalled.txt"} if stalled.status_code == 201 else set())
        stored = await anyio.to_thread.run_sync(files, s3_endpoint, prefix)  # every pack the index names is there
        listed = await call(other, "run_python", {"conversationId": conversation, "code": LIST})

        assert taken.status_code == 201, taken.text
        assert stalled.status_code == 503, stalled.text  # never acknowledged: sent again, it reaches the new owner
        assert acknowledged <= {name.rsplit("/", 1)[-1] for name in stored}, sorted(stored)
        assert listed.structured_content is not None, listed
        # Which replica held the conversation when it was listed, and what the store held.
        seen = (owner.url, other.url, lease_rows(url), time.time(), sorted(stored))  # a database of its own
        assert listed.structured_content["stdout"] == "['first.txt', 'second.txt']\n", (listed, seen)
