"""Answers about any task, by tenant and id: its row, how it is getting on, its result, a page, a cancel.

Task ids are 192 random bits. Every lookup names the tenant with the id (:mod:`.table`), so
another tenant's id is answered like an unknown one. A working task whose owner is lost (see
:mod:`.runtime`: no beat for ``lease`` seconds, or a process of this host that no longer exists) is
failed when it is looked up: no task stays ``working`` forever.

A ``tasks/get`` is polled, often by many clients: it reads no database where it need not. A task
running in this process is answered from the row it wrote (working: a cancel another server
marked in the database while its owner could not be reached stops it at the next beat, and it
says so then). With replicas, a working task of another replica is asked of its owner, and once
it answered, its row (the owner never changes) is remembered, so the next ``tasks/get`` goes
straight to the owner; an owner that does not answer sends the question back to the database.
The tasks running here are :mod:`.runtime`'s; it shares their records (:class:`Running`) with these lookups.
"""

from __future__ import annotations

import collections
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal, Protocol

import anyio
import anyio.to_thread

from mcp_sandbox.events import Event, TaskChanged
from mcp_sandbox.server.tasks.owners import gone_here
from mcp_sandbox.server.tasks.table import TaskRow, TaskTable, decode_cursor, encode_cursor

__all__ = [
    "CANCELLED",
    "OWNER_GONE",
    "PAGE",
    "POLL_INTERVAL_MS",
    "Describe",
    "Peer",
    "Running",
    "TaskEnded",
    "TaskLookups",
    "UnknownTask",
]

POLL_INTERVAL_MS = 1000  # suggested to clients; also how often a waiter polls another owner's task
PAGE = 50  # tasks per tasks/list page
OWNER_GONE = "the server running this task stopped before it finished; call the tool again"
CANCELLED = "cancelled by tasks/cancel"
_ELSEWHERE = 4096  # working tasks of other replicas whose owner is remembered

# Says how a running task is getting on (the last line of its output), or None.
Describe = Callable[[], str | None]


class Peer(Protocol):
    """The replica that runs a task, asked by another (:mod:`.remote`): None when it cannot answer
    (the database does), ``"gone"`` when the process that ran the task is no longer there."""

    async def get(self, row: TaskRow) -> tuple[TaskRow, str | None] | Literal["gone"] | None: ...

    async def cancel(self, row: TaskRow) -> TaskRow | Literal["gone"] | None: ...


class UnknownTask(LookupError):
    """No task of the caller's tenant has that id (never created, another tenant's, or expired)."""


class TaskEnded(Exception):
    """The task has already ended (a cancel of a finished task)."""


@dataclass
class Running:
    """A task running in this process, from before its row is written until its end is recorded."""

    scope: anyio.CancelScope = field(default_factory=anyio.CancelScope)
    done: anyio.Event = field(default_factory=anyio.Event)
    cancelled: bool = False
    describe: Describe | None = None
    row: TaskRow | None = None  # once written


class TaskLookups:
    """Lookups of any task in the (shared) table, those running here (``running``) answered from memory.

    ``owner``: this process's owner name; ``lease``: how long an owner may go without beating;
    ``emit``: told each task failed as lost; ``peer``: asks another replica about the task it runs.
    """

    def __init__(
        self,
        table: TaskTable,
        running: dict[str, Running],
        *,
        owner: str,
        lease: float,
        emit: Callable[[Event], None],
        peer: Peer | None,
    ) -> None:
        self._table = table
        self._running = running
        self.owner = owner
        self._lease = lease
        self._emit = emit
        self._peer = peer
        # Working tasks of other replicas asked of their owner already, by tenant and id: asked of
        # it again without reading the database first (an owner never changes).
        self._elsewhere: collections.OrderedDict[tuple[str, str], TaskRow] = collections.OrderedDict()

    async def get(self, tenant: str, task_id: str) -> TaskRow:
        """The tenant's task ``task_id``, a lost one failed first (one running here: as it was written).

        Raises:
            UnknownTask: no such task of this tenant.
            WorkspaceError: the database cannot answer.
        """
        running = self._running.get(task_id)
        if running is not None and running.row is not None and running.row.tenant == tenant and not running.cancelled:
            return running.row  # runs here: working, whatever another server marked until the next beat stops it
        row = await anyio.to_thread.run_sync(self._table.get, tenant, task_id)
        now = time.time()
        if row is None or (row.terminal and row.expires < now):
            raise UnknownTask(task_id)
        if row.status == "working" and row.id not in self._running and self._lost(row, now):
            if await anyio.to_thread.run_sync(self._table.reap, now, now - self._lease, {row.owner}, OWNER_GONE):
                self._emit(TaskChanged(row.tenant, "failed"))
            row = await anyio.to_thread.run_sync(self._table.get, tenant, task_id)
            if row is None:
                raise UnknownTask(task_id)
        return row

    async def look(self, tenant: str, task_id: str) -> tuple[TaskRow, str | None]:
        """:meth:`get`, with how the task is getting on (:meth:`progress`), asked of the replica
        running it when that is another (straight away when it answered before).

        Raises:
            UnknownTask, WorkspaceError: as :meth:`get`.
        """
        key = (tenant, task_id)
        if self._peer is not None and (known := self._elsewhere.get(key)) is not None:
            answer = await self._peer.get(known)
            if answer is not None:
                return await self._answered(known, answer)
            del self._elsewhere[key]  # its owner does not answer: the database does
            return await self.get(tenant, task_id), None
        row = await self.get(tenant, task_id)
        if row.status != "working" or row.id in self._running or self._peer is None:
            return row, self.progress(task_id)
        answer = await self._peer.get(row)
        return (row, None) if answer is None else await self._answered(row, answer)

    async def _answered(
        self, row: TaskRow, answer: tuple[TaskRow, str | None] | Literal["gone"]
    ) -> tuple[TaskRow, str | None]:
        """What the owner of working task ``row`` answered, its owner remembered while it works."""
        key = (row.tenant, row.id)
        if answer == "gone":
            self._elsewhere.pop(key, None)
            return await self._reaped(row), None
        if answer[0].status == "working":
            self._elsewhere[key] = row
            self._elsewhere.move_to_end(key)
            while len(self._elsewhere) > _ELSEWHERE:
                self._elsewhere.popitem(last=False)
        else:
            self._elsewhere.pop(key, None)
        return answer

    async def _reaped(self, row: TaskRow) -> TaskRow:
        """``row`` once its owner, known to be gone, has its working tasks failed."""
        now = time.time()
        if await anyio.to_thread.run_sync(self._table.reap, now, now - self._lease, {row.owner}, OWNER_GONE):
            self._emit(TaskChanged(row.tenant, "failed"))
        return await self.get(row.tenant, row.id)

    def progress(self, task_id: str) -> str | None:
        """How task ``task_id`` is getting on, when it runs here and says so; else None."""
        running = self._running.get(task_id)
        return None if running is None or running.describe is None else running.describe()

    def runs_here(self, task_id: str) -> bool:
        """Whether task ``task_id`` runs in this process."""
        return task_id in self._running

    def _lost(self, row: TaskRow, now: float) -> bool:
        return row.owner == self.owner or row.heartbeat < now - self._lease or gone_here(row.owner, self.owner)

    async def result(self, tenant: str, task_id: str) -> TaskRow:
        """The task once it has ended (waits for it).

        Raises:
            UnknownTask, WorkspaceError: as :meth:`get`.
        """
        while True:
            row = await self.get(tenant, task_id)
            if row.terminal:
                return row
            running = self._running.get(task_id)
            if running is not None:
                await running.done.wait()
            else:  # run by another server: its row says when it ends
                await anyio.sleep(POLL_INTERVAL_MS / 1000)

    async def page(self, tenant: str, cursor: str | None, size: int = PAGE) -> tuple[list[TaskRow], str | None]:
        """A page of the tenant's tasks, and the cursor of the next one (None: the last page).

        Raises:
            ValidationError: ``cursor`` is not one this server gave.
            WorkspaceError: the database cannot answer.
        """
        after = None if cursor is None else decode_cursor(cursor)
        rows = await anyio.to_thread.run_sync(self._table.page, tenant, after, size + 1)
        following = encode_cursor(rows[size - 1]) if len(rows) > size else None
        now = time.time()
        listed = []
        for row in rows[:size]:
            if row.terminal and row.expires < now:
                continue
            listed.append(await self.get(tenant, row.id) if row.status == "working" else row)
        return listed, following

    async def cancel(self, tenant: str, task_id: str) -> TaskRow:
        """Cancel the task: a run here is stopped (its processes gone) before this returns; one of
        another server is marked and stopped by its owner at its next beat.

        Raises:
            UnknownTask, WorkspaceError: as :meth:`get`.
            TaskEnded: it had already ended.
        """
        row = await self.get(tenant, task_id)
        if row.terminal:
            raise TaskEnded(task_id)
        running = self._running.get(task_id)
        if running is not None:
            running.cancelled = True
            running.scope.cancel()
            await running.done.wait()
            return await self.get(tenant, task_id)
        answer = None if self._peer is None else await self._peer.cancel(row)
        if answer == "gone":
            return await self._reaped(row)
        if answer is not None:  # the owner stopped it
            return answer
        # Marked here; its owner, if alive, stops it at its next beat.
        await anyio.to_thread.run_sync(self._table.finish, task_id, "cancelled", CANCELLED, None, time.time())
        return await self.get(tenant, task_id)
