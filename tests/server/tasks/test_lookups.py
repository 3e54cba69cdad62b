"""Lookups of any task (``server/tasks/lookups.py``): the tenant's own, lost owners, pages, other replicas.

In process: :class:`Tasks` over a real database (SQLite, PostgreSQL), its runs plain coroutines; another
replica's side is :mod:`.remote`'s, called without its HTTP. The wire, the sandbox and the attacks
are tests/e2e/runs/test_tasks.py's.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import Any, cast

import anyio
import pytest

from mcp_sandbox.replicas.forward import Router
from mcp_sandbox.replicas.peers import Reply, Unreachable
from mcp_sandbox.server.tasks.lookups import OWNER_GONE, UnknownTask
from mcp_sandbox.server.tasks.remote import RemoteTasks, serve_task
from mcp_sandbox.server.tasks.runtime import Tasks
from mcp_sandbox.server.tasks.table import TaskRow, TaskTable
from mcp_sandbox.workspace import Metadata
from postgres_helpers import MetadataTarget

from .helpers import BOUND, answer, done, forever

pytestmark = pytest.mark.anyio


async def test_another_tenants_task_is_unknown_to_every_lookup(table: TaskTable) -> None:
    with anyio.fail_after(BOUND):
        async with anyio.create_task_group() as group:
            tasks = Tasks(table, group)
            row, _ = await tasks.start("alice", done, ttl_ms=None, key=None)
            running, _ = await tasks.start("alice", forever, ttl_ms=None, key=None)  # answered from memory
            await tasks.result("alice", row.id)
            for task_id in (row.id, running.id):
                for lookup in (tasks.get, tasks.look, tasks.result, tasks.cancel):
                    with pytest.raises(UnknownTask):
                        await lookup("mallory", task_id)
            listed, _ = await tasks.page("mallory", None)
            assert (await tasks.get("alice", running.id)).status == "working"
            await tasks.cancel("alice", running.id)

    assert listed == []


async def test_a_task_whose_owner_stopped_beating_is_failed_never_working(table: TaskTable) -> None:
    with anyio.fail_after(BOUND):
        async with anyio.create_task_group() as group:
            # The owner writes the row, then dies: it never beats again (its run never ends here).
            dead = Tasks(table, group, lease=0.05, owner="elsewhere:1:dead")
            row, _ = await dead.start("alice", forever, ttl_ms=None, key=None)
            survivor = Tasks(table, group, lease=0.05)
            await anyio.sleep(0.1)  # past the lease: the one wait this test is about
            seen = await survivor.get("alice", row.id)
            group.cancel_scope.cancel()

    assert (seen.status, seen.message) == ("failed", OWNER_GONE)


async def test_a_task_of_a_process_gone_from_this_host_is_failed_at_once(table: TaskTable) -> None:
    with anyio.fail_after(BOUND):
        async with anyio.create_task_group() as group:
            here = Tasks(table, group)
            host = here.owner.partition(":")[0]
            process = await anyio.open_process(["true"])
            await process.wait()  # its pid is now free
            dead = Tasks(table, group, owner=f"{host}:{process.pid}:x")
            row, _ = await dead.start("alice", forever, ttl_ms=None, key=None)
            seen = await here.get("alice", row.id)
            group.cancel_scope.cancel()

    assert seen.status == "failed"


async def test_an_ended_task_past_its_ttl_is_unknown_and_purged(table: TaskTable) -> None:
    with anyio.fail_after(BOUND):
        async with anyio.create_task_group() as group:
            tasks = Tasks(table, group)
            row, _ = await tasks.start("alice", done, ttl_ms=1, key="k")
            await tasks.result("alice", row.id)
            assert row.ttl_ms == 1000  # the shortest kept
            assert table.purge(time.time()) == 0
            assert table.purge(row.expires + 1) == 1
            with pytest.raises(UnknownTask):
                await tasks.get("alice", row.id)
            again, new = await tasks.start("alice", done, ttl_ms=None, key="k")

    assert new and again.id != row.id  # the key is free again once its task is gone


async def test_the_list_is_the_tenants_own_in_pages_a_cursor_continues(table: TaskTable) -> None:
    with anyio.fail_after(BOUND):
        async with anyio.create_task_group() as group:
            tasks = Tasks(table, group)
            made = [(await tasks.start("alice", done, ttl_ms=None, key=None))[0].id]
            made += [(await tasks.start("alice", done, ttl_ms=None, key=None))[0].id]
            made += [(await tasks.start("alice", done, ttl_ms=None, key=None))[0].id]
            await tasks.start("bob", done, ttl_ms=None, key=None)
            first, cursor = await tasks.page("alice", None, size=2)
            assert cursor is not None
            second, last = await tasks.page("alice", cursor, size=2)

    assert [row.id for row in first + second] == made
    assert last is None


async def test_a_task_is_answered_by_another_server_of_the_database(table: TaskTable) -> None:
    release = anyio.Event()

    async def run() -> dict[str, Any]:
        await release.wait()
        return answer("from the owner")

    with anyio.fail_after(BOUND):
        async with anyio.create_task_group() as group:
            owner, other = Tasks(table, group), Tasks(table, group)
            row, _ = await owner.start("alice", run, ttl_ms=None, key=None)
            assert (await other.get("alice", row.id)).status == "working"  # beating: not lost
            release.set()
            ended = await other.result("alice", row.id)  # waits on the row, not on the owner's run
            listed, _ = await other.page("alice", None)

    assert ended.status == "completed" and ended.result is not None and "from the owner" in ended.result
    assert [task.id for task in listed] == [row.id]


class CountingTable(TaskTable):
    """The real table, counting the reads of one task."""

    reads = 0

    def get(self, tenant: str, task_id: str) -> TaskRow | None:
        self.reads += 1
        return super().get(tenant, task_id)


@pytest.fixture
async def counted(metadata_target: MetadataTarget) -> AsyncIterator[CountingTable]:
    metadata = Metadata.open(metadata_target.path, metadata_target.url)
    try:
        yield CountingTable(metadata.database)
    finally:
        metadata.close()


class Hop:
    """The internal hop to the owner without its HTTP: the owner's side (serve_task) called in process."""

    me = "http://other"

    def __init__(self, owner: Tasks) -> None:
        self._serve = serve_task(owner)
        self.asked = 0
        self.down = False

    async def ask(self, url: str, request: dict[str, Any]) -> Reply:
        self.asked += 1
        if self.down:
            raise Unreachable(f"{url} is down")
        return Reply(*await self._serve(request))


async def test_a_polled_task_is_asked_of_its_owner_and_neither_reads_the_database_again(counted: CountingTable) -> None:
    with anyio.fail_after(BOUND):
        async with anyio.create_task_group() as group:
            owner = Tasks(counted, group, url="http://owner")
            hop = Hop(owner)
            other = Tasks(counted, group, url=hop.me, peer=RemoteTasks(cast("Router", hop)))
            row, _ = await owner.start("alice", forever, ttl_ms=None, key=None, describe=lambda: "tick 3")
            reads = counted.reads
            polled = [await other.look("alice", row.id) for _ in range(4)]
            assert counted.reads - reads == 1 and hop.asked == 4  # the first poll's own read; none at the owner
            with pytest.raises(UnknownTask):  # remembered for alice only
                await other.look("mallory", row.id)
            await owner.cancel("alice", row.id)
            ended, _ = await other.look("alice", row.id)  # the owner says it ended: forgotten
            reads, asked = counted.reads, hop.asked
            assert (await other.look("alice", row.id))[0].status == "cancelled"
            assert (counted.reads - reads, hop.asked - asked) == (1, 0)

            second, _ = await owner.start("alice", forever, ttl_ms=None, key=None)
            await other.look("alice", second.id)
            hop.down = True
            unanswered = await other.look("alice", second.id)  # the database answers (the lease decides)
            hop.down = False
            reads = counted.reads
            await other.look("alice", second.id)  # forgotten when its owner did not answer
            assert counted.reads - reads == 1
            await owner.cancel("alice", second.id)

    assert [(seen.status, progress) for seen, progress in polled] == [("working", "tick 3")] * 4
    assert ended.status == "cancelled"
    assert unanswered[0].status == "working" and unanswered[1] is None
