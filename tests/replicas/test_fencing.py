"""A replica stalled past its lease in the middle of an upload records nothing when it wakes up.

Real replicas sharing a PostgreSQL database and a SeaweedFS store: the owner of a conversation is
stopped (SIGSTOP) while an upload's body is still coming, another replica takes the expired lease
and stores a file of its own, and the stalled one is continued (SIGCONT) and sent the rest of the
body. Before the writes were fenced by the lease's epoch, it stored the file beside the new
owner's, recorded its own listing over theirs and wrote it back: the conversation passed its quota
in the store (issue 37).

An owner that stops itself just before the index write of an upload's write-back, after its last
fence check, wakes up to a refused write once another replica took over; one that stops just after
that write reached the store leaves its file to the new owner, stored but not acknowledged.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import anyio
import httpx2
import psycopg
import pytest

from mcp_sandbox.replicas.indexing import STOP_AFTER_INDEX, STOP_BEFORE_INDEX
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


@dataclass(frozen=True)
class Takeover:
    """What :func:`taken_over` did: the replicas, the database, the conversation and the answers."""

    owner: Replica
    other: Replica
    database_url: str
    conversation: str
    stalled: httpx2.Response  # the owner's answer to stalled.txt, once continued
    taken: httpx2.Response  # the other replica's answer to second.txt, stored while the owner was stopped


@contextlib.asynccontextmanager
async def taken_over(
    postgres: Cluster, s3_endpoint: str, prefix: str, runtime: Path | None, stop: str
) -> AsyncIterator[Takeover]:
    """Two replicas; the owner stores first.txt, then stops itself (SIGSTOP) at ``stop`` (a stop point
    of :mod:`.indexing`) in the write-back of stalled.txt's upload; once its lease expired, the other
    replica takes the conversation over and stores second.txt; then the owner is continued and
    answers. Yields while both still run."""
    url = postgres.create_database()
    env = {
        **s3_env(s3_endpoint),
        "MCP_SANDBOX_OBJECT_STORE_URL": prefix,
        "MCP_SANDBOX_REPLICA_LEASE": f"{LEASE:g}",
        stop: "stalled.txt",
    }
    async with replicas(2, url, runtime, **env) as (owner, other):
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
        yield Takeover(owner, other, url, conversation, replies[0], taken)


def names(stored: dict[str, bytes]) -> set[str]:
    """The file names of ``stored`` (:func:`s3_helpers.files`), their workspace's prefix left out."""
    return {name.rsplit("/", 1)[-1] for name in stored}


async def test_an_owner_stalled_before_its_index_write_leaves_the_new_owners_index_and_files(
    postgres: Cluster, s3_endpoint: str, sandbox_runtime: Path | None
) -> None:
    prefix = store_url()
    # The owner stops after its last fence check, before its index write.
    async with taken_over(postgres, s3_endpoint, prefix, sandbox_runtime, STOP_BEFORE_INDEX) as run:
        stalled, taken = run.stalled, run.taken
        acknowledged = {"first.txt", "second.txt"} | ({"stalled.txt"} if stalled.status_code == 201 else set())
        stored = await anyio.to_thread.run_sync(files, s3_endpoint, prefix)  # every pack the index names is there
        listed = await call(run.other, "run_python", {"conversationId": run.conversation, "code": LIST})
        # Which replica held the conversation when it was listed, and what the store held.
        seen = (run.owner.url, run.other.url, lease_rows(run.database_url), time.time(), sorted(stored))

        assert taken.status_code == 201, taken.text
        assert stalled.status_code == 503, stalled.text  # never acknowledged: sent again, it reaches the new owner
        assert acknowledged <= names(stored), sorted(stored)
        assert listed.structured_content is not None, listed
        assert listed.structured_content["stdout"] == "['first.txt', 'second.txt']\n", (listed, seen)


async def test_an_owner_stalled_after_its_index_write_leaves_its_file_to_the_new_owner(
    postgres: Cluster, s3_endpoint: str, sandbox_runtime: Path | None
) -> None:
    """The owner's index write reached the store while it held the lease, and it stopped before it
    could check the lease again: the new owner takes the conversation over with that index, its
    file with it, and counts it in the quota. Continued, the owner finds its lease gone and does
    not acknowledge the upload (503): the file is stored all the same, as after an answer lost."""
    prefix = store_url()
    async with taken_over(postgres, s3_endpoint, prefix, sandbox_runtime, STOP_AFTER_INDEX) as run:
        stored = await anyio.to_thread.run_sync(files, s3_endpoint, prefix)
        listed = await call(run.other, "run_python", {"conversationId": run.conversation, "code": LIST})
        seen = (run.owner.url, run.other.url, lease_rows(run.database_url), time.time(), sorted(stored))

        assert run.taken.status_code == 201, run.taken.text
        assert run.stalled.status_code == 503, run.stalled.text  # the lease was lost before it could be acknowledged
        assert "may or may not be kept; send the request again" in run.stalled.text  # it was, here
        assert names(stored) == {"first.txt", "stalled.txt", "second.txt"}, sorted(stored)
        assert sorted(stored.values()) == sorted([b"1" * 1000, b"2" * 3000, b"s" * 2000])
        assert listed.structured_content is not None, listed
        assert listed.structured_content["stdout"] == "['first.txt', 'second.txt', 'stalled.txt']\n", (listed, seen)
        assert recorded_usage(run.database_url) == [(1000 + 3000 + 2000, 3)]
