"""``tasks/*`` of a task another replica runs: asked of that replica while it lives, else the database.

With replicas, a task's owner names the replica running it (its ``replica_url`` after the
process's id, :attr:`.Tasks.owner`). Any replica reads a task's row from the shared database,
but only the owner knows how its run is getting on and can stop its processes: a ``tasks/get``
or ``tasks/cancel`` that lands on another replica is posted to the owner's internal route
(signed, as forwarded calls are: :mod:`mcp_sandbox.replicas.internal_route`), which answers
from the task it runs: the live ``statusMessage``, a cancel that ends the run's processes before
it answers. An owner URL that answers from another process (the replica restarted) says the task
is not there, and the task is failed at once; an owner that cannot be reached leaves the answer
to the database, where the lease fails the task once its owner stops beating (never ``working``
for ever).
"""

from __future__ import annotations

import dataclasses
import json
import logging
from typing import Any, Literal

from mcp_sandbox.errors import WorkspaceError
from mcp_sandbox.replicas.forward import Router
from mcp_sandbox.replicas.internal_route import ServeTask
from mcp_sandbox.replicas.peers import PeerError
from mcp_sandbox.server.tasks.lookups import TaskEnded, UnknownTask
from mcp_sandbox.server.tasks.runtime import Tasks
from mcp_sandbox.server.tasks.table import TaskRow

__all__ = ["RemoteTasks", "owner_url", "serve_task"]

logger = logging.getLogger(__name__)

_GONE = 410  # the owner's URL answers, but the process that ran the task is not there


def owner_url(owner: str) -> str | None:
    """The replica URL a task's ``owner`` names; None without replicas."""
    return owner.partition("@")[2] or None


def _row(answer: dict[str, Any]) -> TaskRow:
    fields = {field.name for field in dataclasses.fields(TaskRow)}
    return TaskRow(**{name: value for name, value in answer.items() if name in fields})


class RemoteTasks:
    """A :class:`~.runtime.Peer`: the replica running a task, asked through ``router``."""

    def __init__(self, router: Router) -> None:
        self._router = router

    async def _ask(self, op: str, row: TaskRow) -> dict[str, Any] | Literal["gone"] | None:
        url = owner_url(row.owner)
        if url is None or url == self._router.me:  # a process of this replica: the lease and the pid decide
            return None
        request = {"op": op, "tenant": row.tenant, "taskId": row.id, "owner": row.owner}
        try:
            reply = await self._router.ask(url, request)
        except PeerError as exc:
            logger.info("the replica %s running task %s does not answer (%s): the database does", url, row.id, exc)
            return None
        if reply.status == _GONE:
            return "gone"
        if reply.status != 200:
            logger.warning("the replica %s answered %s of task %s with HTTP %d", url, op, row.id, reply.status)
            return None
        answer: dict[str, Any] = json.loads(reply.body)
        return answer

    async def get(self, row: TaskRow) -> tuple[TaskRow, str | None] | Literal["gone"] | None:
        answer = await self._ask("get", row)
        if answer is None or answer == "gone":
            return answer
        progress = answer.get("progress")
        return _row(answer), progress if isinstance(progress, str) else None

    async def cancel(self, row: TaskRow) -> TaskRow | Literal["gone"] | None:
        answer = await self._ask("cancel", row)
        return answer if answer is None or answer == "gone" else _row(answer)


def serve_task(tasks: Tasks) -> ServeTask:
    """The owner's side: answers another replica's ``get`` or ``cancel`` of a task of ``tasks``."""

    async def serve(request: dict[str, Any]) -> tuple[int, bytes]:
        op, tenant, task_id, owner = (request.get(name) for name in ("op", "tenant", "taskId", "owner"))
        if not (isinstance(tenant, str) and isinstance(task_id, str) and op in ("get", "cancel")):
            return 400, b"{}"
        if owner != tasks.owner:  # asked of this URL, but another process ran it
            return _GONE, b"{}"
        try:
            if op == "cancel":
                try:
                    row = await tasks.cancel(tenant, task_id)
                except TaskEnded:
                    row = await tasks.get(tenant, task_id)
            else:
                row = await tasks.get(tenant, task_id)
        except UnknownTask:
            return 404, b"{}"
        except WorkspaceError:
            return 503, b"{}"
        answer = {**dataclasses.asdict(row), "progress": tasks.progress(task_id)}
        return 200, json.dumps(answer).encode("utf-8")

    return serve
