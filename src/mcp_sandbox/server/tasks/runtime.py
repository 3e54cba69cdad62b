"""Tool calls run as tasks: started in the service's task group, each one's row in the metadata database.

A task's row is written before its handle is returned, so a client that lost the answer, or
asks another replica, or asks after a restart, still finds it. The process running a task is its
owner: ``host:pid:random`` (the id is unique per process start). It beats every
:data:`HEARTBEAT` seconds for its working tasks; a working task whose owner has not beaten for
:data:`LEASE` seconds, or whose owner is a process of this host that no longer exists (SQLite
is one host's database, so a server killed with -9 is known at once there), is ``failed`` with
a message that says so: no task stays ``working`` forever. A server that stops normally fails
the tasks it still runs the same way before it exits.

Task ids are 192 random bits. Every lookup names the tenant with the id (:mod:`.table`), so
another tenant's id is answered like an unknown one.

A ``tasks/get`` is polled, often by many clients: it reads no database where it need not. A task
running in this process is answered from the row it wrote (working: a cancel another server
marked in the database while its owner could not be reached stops it at the next beat, and it
says so then). With replicas, a working task of another replica is asked of its owner, and once
it answered, its row (the owner never changes) is remembered, so the next ``tasks/get`` goes
straight to the owner; an owner that does not answer sends the question back to the database.
"""

from __future__ import annotations

import collections
import json
import logging
import secrets
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace
from typing import Any, Literal, Protocol

import anyio
import anyio.to_thread
from anyio.abc import TaskGroup
from mcp.shared.exceptions import MCPError

from mcp_sandbox import tracing
from mcp_sandbox.errors import WorkspaceError
from mcp_sandbox.events import Event, TaskChanged
from mcp_sandbox.server.tasks.owners import gone_here, new_owner
from mcp_sandbox.server.tasks.table import LEASE, TaskRow, TaskTable, decode_cursor, encode_cursor

__all__ = [
    "DEFAULT_TTL_MS",
    "HEARTBEAT",
    "LEASE",
    "MAX_TTL_MS",
    "OWNER_GONE",
    "PAGE",
    "POLL_INTERVAL_MS",
    "RunLost",
    "TaskEnded",
    "Tasks",
    "UnknownTask",
]

logger = logging.getLogger(__name__)

DEFAULT_TTL_MS = 3_600_000  # a task and its result are kept an hour unless the client asks otherwise
MAX_TTL_MS = 86_400_000  # and at most a day (and never past the conversation's retention)
HEARTBEAT = 10.0  # seconds between an owner's beats
POLL_INTERVAL_MS = 1000  # suggested to clients; also how often a waiter polls another owner's task
PAGE = 50  # tasks per tasks/list page
OWNER_GONE = "the server running this task stopped before it finished; call the tool again"
CANCELLED = "cancelled by tasks/cancel"
_ELSEWHERE = 4096  # working tasks of other replicas whose owner is remembered

# What a task runs: the tool call, answered as the wire dict of its result.
Run = Callable[[], Awaitable[dict[str, Any]]]
# Told each status a task reaches after its start (notifications/tasks/status); may be None.
Notify = Callable[[TaskRow], Awaitable[None]]
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


class RunLost(Exception):
    """Raised by a task's run that its server stopped (a shutdown): the task fails with the message."""


@dataclass
class _Running:
    scope: anyio.CancelScope = field(default_factory=anyio.CancelScope)
    done: anyio.Event = field(default_factory=anyio.Event)
    cancelled: bool = False
    describe: Describe | None = None
    row: TaskRow | None = None  # once written


class Tasks:
    """The tasks of one server process: started here, looked up anywhere (the table is shared)."""

    def __init__(
        self,
        table: TaskTable,
        group: TaskGroup,
        *,
        max_ttl_ms: int = MAX_TTL_MS,
        lease: float = LEASE,
        heartbeat: float = HEARTBEAT,
        owner: str | None = None,
        emit: Callable[[Event], None] | None = None,
        peer: Peer | None = None,
        url: str | None = None,
    ) -> None:
        self._table = table
        self._group = group
        self._max_ttl_ms = max_ttl_ms
        self._lease = lease
        self._heartbeat = heartbeat
        # With replicas the owner names its replica (its replica_url): another replica asks it (``peer``).
        self.owner = (owner or new_owner()) + ("" if url is None else f"@{url}")
        self._peer = peer
        self._running: dict[str, _Running] = {}
        # Working tasks of other replicas asked of their owner already, by tenant and id: asked of
        # it again without reading the database first (an owner never changes).
        self._elsewhere: collections.OrderedDict[tuple[str, str], TaskRow] = collections.OrderedDict()
        self._emit = emit or (lambda event: None)  # the service's EventHub: metrics count tasks by state

    @property
    def running(self) -> int:
        """How many tasks run here now."""
        return len(self._running)

    async def start(
        self,
        tenant: str,
        run: Run,
        *,
        ttl_ms: int | None,
        key: str | None,
        request: str = "",
        notify: Notify | None = None,
        describe: Describe | None = None,
    ) -> tuple[TaskRow, bool]:
        """Write the task's row, then start ``run``; the row and True, or the task that already
        holds idempotency ``key`` and False (nothing is run). ``request``: a digest of what ``run``
        runs; a key names one request. ``describe``: what :meth:`progress` says while it runs.

        Raises:
            KeyReused: ``key`` names a task of another request (nothing is run).
            WorkspaceError: the database refused or cannot be reached (nothing is run).
        """
        now = time.time()
        ttl = min(DEFAULT_TTL_MS if ttl_ms is None else max(ttl_ms, 1000), self._max_ttl_ms)
        row = TaskRow(
            id=secrets.token_urlsafe(24),
            tenant=tenant,
            owner=self.owner,
            status="working",
            message=None,
            created=now,
            updated=now,
            ttl_ms=ttl,
            expires=now + ttl / 1000,
            heartbeat=now,
            idempotency_key=key,
            request=request,
            result=None,
        )
        running = self._running[row.id] = _Running(describe=describe)  # before the row exists: never read as lost
        try:
            stored = await anyio.to_thread.run_sync(self._table.insert, row)
        except BaseException:
            del self._running[row.id]
            raise
        if stored.id != row.id:
            del self._running[row.id]
            return stored, False
        running.row = row
        self._emit(TaskChanged(tenant, "working"))
        self._group.start_soon(self._run, row, running, run, notify)
        return row, True

    async def _run(self, row: TaskRow, running: _Running, run: Run, notify: Notify | None) -> None:
        status: str = "failed"
        message: str | None = OWNER_GONE
        result: str | None = None
        # (unless the run ends: the server stopped with it still going)
        try:
            # The run may outlive the call that started it (answered with the task): its steps get spans of their own.
            with running.scope, tracing.background():
                try:
                    payload = await run()
                except RunLost as exc:
                    status, message = "failed", str(exc)
                    result = json.dumps({"error": {"code": -32603, "message": str(exc)}})
                except MCPError as exc:  # a protocol error: the task failed, tasks/result answers the error
                    status, message = "failed", exc.error.message
                    result = json.dumps({"error": exc.error.model_dump(mode="json", exclude_none=True)})
                except Exception:
                    logger.exception("task %s failed", row.id)
                    status, message = "failed", "internal error"
                    result = json.dumps({"error": {"code": -32603, "message": "internal error"}})
                else:  # a tool result, an error result too: the task completed
                    status, message, result = "completed", None, json.dumps({"result": payload})
        finally:
            with anyio.CancelScope(shield=True):
                if running.cancelled:
                    status, message, result = "cancelled", CANCELLED, None
                now = time.time()
                try:
                    with anyio.fail_after(30):
                        await anyio.to_thread.run_sync(self._table.finish, row.id, status, message, result, now)
                except (WorkspaceError, TimeoutError) as exc:  # the lease ends it as lost
                    logger.error("could not record the end of task %s: %s", row.id, exc)
                self._emit(TaskChanged(row.tenant, status))
                if notify is not None:  # before the waiters: the status comes before the result
                    ended = replace(row, status=status, message=message, updated=now)
                    with anyio.move_on_after(1):
                        try:
                            await notify(ended)
                        except Exception as exc:  # best effort: the client may be gone
                            logger.debug("could not notify task %s's status: %s", row.id, exc)
                self._running.pop(row.id, None)
                running.done.set()

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

    async def keep(self) -> None:
        """Beat for this server's tasks, fail lost ones, stop the ones cancelled elsewhere, purge
        expired ones; until cancelled."""
        while True:
            try:
                await self.upkeep()
            except WorkspaceError as exc:
                logger.warning("task upkeep failed: %s", exc)
            await anyio.sleep(self._heartbeat)

    async def upkeep(self) -> None:
        """One round of :meth:`keep`."""
        now = time.time()
        table = self._table
        if self._running:
            await anyio.to_thread.run_sync(table.beat, self.owner, now)
        owners = await anyio.to_thread.run_sync(table.working_owners)
        gone = {owner for owner in owners if gone_here(owner, self.owner)}
        await anyio.to_thread.run_sync(table.reap, now, now - self._lease, gone, OWNER_GONE)
        for task_id in await anyio.to_thread.run_sync(table.cancelled_of, self.owner, list(self._running)):
            if (running := self._running.get(task_id)) is not None:
                running.cancelled = True
                running.scope.cancel()
        await anyio.to_thread.run_sync(table.purge, now)
