"""The run history (the metadata's ``executions`` table), written from the ``RunFinished`` events.

A run is described once, by its event; :func:`execution_record` is the one place its history
row is derived from it. Rows are written after the call is answered, off its path: a short
while later (:data:`HISTORY_DELAY`), together with the rows of the runs that ended meanwhile, in
one transaction (one worker thread hop for them all), so the write never competes with the
answer it follows and under load costs a fraction of a run. The task group the writes run in
is never cancelled: closing it waits for the last ones.
"""

from __future__ import annotations

import logging

import anyio
import anyio.to_thread
from anyio.abc import TaskGroup

from mcp_sandbox.errors import DiskFullError, WorkspaceError
from mcp_sandbox.events import Event, RunFinished
from mcp_sandbox.workspace import ExecutionRecord, Metadata
from mcp_sandbox.workspace.executions import record_execution, record_executions

__all__ = ["HISTORY_DELAY", "History", "execution_record"]

logger = logging.getLogger(__name__)

# How long the history waits before writing a run's row: past its answer, gathering the rows
# of the runs that end meanwhile into the same transaction. Each batch costs a task, a worker
# thread's wake-up and a transaction; at 0.05 s back-to-back runs under load got a batch each.
# (A server killed outright loses the rows of this last interval; a graceful stop writes them.)
HISTORY_DELAY = 0.25


def execution_record(event: RunFinished) -> ExecutionRecord:
    """The history's row for a finished run (a run refused as busy is an ``error`` there, as its result is)."""
    return ExecutionRecord(
        tenant=event.tenant,
        conversation=event.conversation,
        language=event.language,
        started_at=event.started_at,
        duration_ms=event.run_ms,
        status="error" if event.status == "busy" else event.status,
        exit_code=event.exit_code,
        stdout_bytes=event.stdout_bytes,
        stderr_bytes=event.stderr_bytes,
        files_bytes=event.files_bytes,
    )


class History:
    """An :class:`~mcp_sandbox.events.EventHub` observer adding each finished run to ``metadata``.

    Events must be emitted on the event loop that runs ``writes``; a failed write is logged.
    """

    def __init__(self, metadata: Metadata, writes: TaskGroup) -> None:
        self._metadata = metadata
        self._writes = writes
        self._pending: list[ExecutionRecord] = []
        self._writing = False  # a task of writes is at it

    def observe(self, event: Event) -> None:
        if not isinstance(event, RunFinished):
            return
        self._pending.append(execution_record(event))
        if not self._writing:
            self._writing = True
            self._writes.start_soon(self._write)

    async def _write(self) -> None:
        try:
            with anyio.CancelScope(shield=True):  # bounded: a short wait, then writes that always end
                await anyio.sleep(HISTORY_DELAY)
                while self._pending:
                    batch = list(self._pending)
                    self._pending.clear()
                    try:
                        await anyio.to_thread.run_sync(self._record_all, batch)
                    except DiskFullError as exc:  # one line per batch: a full disk is no bug
                        logger.error("could not record %d executions in the metadata database: %s", len(batch), exc)
                    except Exception:  # losing metadata rows must not lose the runs' results
                        logger.exception("could not record %d executions in the metadata database", len(batch))
        finally:
            self._writing = False

    def _record_all(self, batch: list[ExecutionRecord]) -> None:
        try:
            record_executions(self._metadata.database, batch)
        except WorkspaceError as exc:
            if len(batch) == 1 or isinstance(exc, DiskFullError):
                raise
            for record in batch:  # one bad row spoils only itself
                try:
                    record_execution(self._metadata.database, record)
                except WorkspaceError:
                    logger.exception("could not record an execution in the metadata database")
