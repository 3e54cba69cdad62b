"""Tasks run by one server process (``server/tasks/runtime.py``) on each engine of the metadata index.

In process: a :class:`Tasks` over a real database (SQLite, PostgreSQL), its runs plain coroutines.
Lookups of any task are test_lookups.py's; the wire, the sandbox and the attacks are
tests/e2e/runs/test_tasks.py's.
"""

from __future__ import annotations

from typing import Any

import anyio
import pytest

from mcp_sandbox.events import Event
from mcp_sandbox.server.metrics import Metrics
from mcp_sandbox.server.tasks.lookups import TaskEnded
from mcp_sandbox.server.tasks.runtime import Tasks
from mcp_sandbox.server.tasks.table import KeyReused, TaskTable

from .helpers import BOUND, answer, done, forever

pytestmark = pytest.mark.anyio


async def test_a_task_is_working_until_its_run_ends_then_completed_with_its_result(table: TaskTable) -> None:
    release = anyio.Event()

    async def run() -> dict[str, Any]:
        await release.wait()
        return answer("done")

    with anyio.fail_after(BOUND):
        async with anyio.create_task_group() as group:
            tasks = Tasks(table, group)
            row, new = await tasks.start("alice", run, ttl_ms=None, key=None)
            assert new and len(row.id) >= 32  # 192 random bits, base64url
            assert (await tasks.get("alice", row.id)).status == "working"
            release.set()
            ended = await tasks.result("alice", row.id)

    assert ended.status == "completed"
    assert ended.result is not None and '"done"' in ended.result
    assert ended.ttl_ms == 3_600_000


async def test_a_repeated_idempotency_key_returns_the_first_task_and_runs_nothing(table: TaskTable) -> None:
    runs = 0

    async def run() -> dict[str, Any]:
        nonlocal runs
        runs += 1
        return answer("once")

    with anyio.fail_after(BOUND):
        async with anyio.create_task_group() as group:
            tasks = Tasks(table, group)
            first, new = await tasks.start("alice", run, ttl_ms=None, key="k")
            again, repeated = await tasks.start("alice", run, ttl_ms=None, key="k")
            others, theirs = await tasks.start("bob", run, ttl_ms=None, key="k")  # keys are per tenant

    assert (new, repeated, theirs) == (True, False, True)
    assert again.id == first.id != others.id
    assert runs == 2


async def test_a_key_names_one_request_another_call_with_it_is_refused(table: TaskTable) -> None:
    with anyio.fail_after(BOUND):
        async with anyio.create_task_group() as group:
            tasks = Tasks(table, group)
            await tasks.start("alice", done, ttl_ms=None, key="k", request="print(1)")
            with pytest.raises(KeyReused):
                await tasks.start("alice", done, ttl_ms=None, key="k", request="print(2)")
            listed, _ = await tasks.page("alice", None)

    assert len(listed) == 1


async def test_a_cancel_ends_the_run_before_it_answers_and_a_second_cancel_is_refused(table: TaskTable) -> None:
    started, stopped = anyio.Event(), anyio.Event()

    async def run() -> dict[str, Any]:
        try:
            started.set()
            await anyio.sleep_forever()
        finally:
            stopped.set()
        raise AssertionError("unreachable")

    with anyio.fail_after(BOUND):
        async with anyio.create_task_group() as group:
            tasks = Tasks(table, group)
            row, _ = await tasks.start("alice", run, ttl_ms=None, key=None)
            await started.wait()
            cancelled = await tasks.cancel("alice", row.id)
            assert stopped.is_set()
            with pytest.raises(TaskEnded):
                await tasks.cancel("alice", row.id)

    assert cancelled.status == "cancelled"


async def test_a_cancel_through_another_server_stops_the_owners_run_at_its_next_beat(table: TaskTable) -> None:
    with anyio.fail_after(BOUND):
        async with anyio.create_task_group() as group:
            owner, other = Tasks(table, group), Tasks(table, group)
            row, _ = await owner.start("alice", forever, ttl_ms=None, key=None)
            await other.cancel("alice", row.id)
            assert owner.running == 1
            assert (await owner.get("alice", row.id)).status == "working"  # it still runs, until its beat
            await owner.upkeep()
            ended = await owner.result("alice", row.id)

    assert ended.status == "cancelled" and owner.running == 0


async def test_the_metrics_count_tasks_by_the_state_they_reached(table: TaskTable) -> None:
    metrics = Metrics(dict, dict)
    events: list[Event] = []

    def emit(event: Event) -> None:
        events.append(event)
        metrics.observe(event)

    with anyio.fail_after(BOUND):
        async with anyio.create_task_group() as group:
            tasks = Tasks(table, group, emit=emit)
            finished, _ = await tasks.start("alice", done, ttl_ms=None, key=None)
            stopped, _ = await tasks.start("alice", forever, ttl_ms=None, key=None)
            await tasks.result("alice", finished.id)
            await tasks.cancel("alice", stopped.id)
    page = metrics.render().decode()

    assert sorted(getattr(event, "status", "") for event in events) == ["cancelled", "completed", "working", "working"]
    assert 'mcp_sandbox_tasks_total{status="working",tenant="alice"} 2.0' in page
    assert 'mcp_sandbox_tasks_total{status="completed",tenant="alice"} 1.0' in page
    assert 'mcp_sandbox_tasks_total{status="cancelled",tenant="alice"} 1.0' in page
