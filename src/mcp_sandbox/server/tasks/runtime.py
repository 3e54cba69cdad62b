"""Tool calls run as tasks: started in the service's task group, each one's row in the metadata database.

A task's row is written before its handle is returned, so a client that lost the answer, or
asks another replica, or asks after a restart, still finds it. The process running a task is its
owner: ``host:pid:random`` (the id is unique per process start). It beats every
:data:`HEARTBEAT` seconds for its working tasks; a working task whose owner has not beaten for
:data:`LEASE` seconds, or whose owner is a process of this host that no longer exists (SQLite
is one host's database, so a server killed with -9 is known at once there), is ``failed`` with
a message that says so: no task stays ``working`` forever. A server that stops normally fails
the tasks it still runs the same way before it exits.

Looking a task up (any task, run here or elsewhere: ``tasks/get``, ``tasks/result``,
``tasks/list``, ``tasks/cancel``) is :mod:`.lookups`'; :class:`Tasks` is both.
"""

from __future__ import annotations

import json
import logging
import secrets
import time
from collections.abc import Awaitable, Callable
from dataclasses import replace
from typing import Any

import anyio
import anyio.to_thread
from anyio.abc import TaskGroup
from mcp.shared.exceptions import MCPError

from mcp_sandbox import tracing
from mcp_sandbox.errors import WorkspaceError
from mcp_sandbox.events import Event, TaskChanged
from mcp_sandbox.server.tasks.lookups import CANCELLED, OWNER_GONE, Describe, Peer, Running, TaskLookups
from mcp_sandbox.server.tasks.owners import gone_here, new_owner
from mcp_sandbox.server.tasks.table import LEASE, TaskRow, TaskTable

__all__ = ["DEFAULT_TTL_MS", "HEARTBEAT", "LEASE", "MAX_TTL_MS", "Notify", "RunLost", "Tasks"]

logger = logging.getLogger(__name__)

DEFAULT_TTL_MS = 3_600_000  # a task and its result are kept an hour unless the client asks otherwise
MAX_TTL_MS = 86_400_000  # and at most a day (and never past the conversation's retention)
HEARTBEAT = 10.0  # seconds between an owner's beats

# What a task runs: the tool call, answered as the wire dict of its result.
Run = Callable[[], Awaitable[dict[str, Any]]]
# Told each status a task reaches after its start (notifications/tasks/status); may be None.
Notify = Callable[[TaskRow], Awaitable[None]]


class RunLost(Exception):
    """Raised by a task's run that its server stopped (a shutdown): the task fails with the message."""


class Tasks(TaskLookups):
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
        # With replicas the owner names its replica (its replica_url): another replica asks it (``peer``).
        # ``emit``: the service's EventHub (metrics count tasks by state).
        super().__init__(
            table,
            {},
            owner=(owner or new_owner()) + ("" if url is None else f"@{url}"),
            lease=lease,
            emit=emit or (lambda event: None),
            peer=peer,
        )
        self._group = group
        self._max_ttl_ms = max_ttl_ms
        self._heartbeat = heartbeat

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
        running = self._running[row.id] = Running(describe=describe)  # before the row exists: never read as lost
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

    async def _run(self, row: TaskRow, running: Running, run: Run, notify: Notify | None) -> None:
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
