"""The 2025-11-25 design of MCP Tasks on the wire: ``tools/call`` with ``task``, and ``tasks/*``.

The SDK carries the types but no runtime (its request unions leave ``tasks/*`` out), so the
methods are bound here: a server middleware answers a task-augmented ``tools/call`` with a
``CreateTaskResult`` at once (the SDK's result sieve knows only ``CallToolResult`` for that
method, and a middleware owns its result), and ``tasks/get``, ``tasks/result``, ``tasks/list``
and ``tasks/cancel`` are request handlers of their own. Only the handshake era has them: the
2026-07-28 revision moved tasks to an extension (:mod:`.extension`). While a task works,
``tasks/get`` says the time so far and the last line its run printed (:mod:`.lastline`).

``_meta.idempotencyKey`` on a ``tools/call`` (with a task or without) makes the call a task
keyed by it: a repeat of the key by the same tenant within the task's time to live returns the
first call's task, or waits for its result, and runs nothing again.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, TypeVar, cast

import mcp_types as types
from mcp.shared.exceptions import MCPError
from mcp_types import INTERNAL_ERROR, INVALID_PARAMS, METHOD_NOT_FOUND
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

from mcp_sandbox.engine import OutputListener
from mcp_sandbox.errors import ValidationError, WorkspaceError
from mcp_sandbox.server.auth.tokens import tenant_of
from mcp_sandbox.server.tasks.lastline import LastLine, working_message
from mcp_sandbox.server.tasks.lookups import POLL_INTERVAL_MS, Describe, TaskEnded, UnknownTask
from mcp_sandbox.server.tasks.runtime import Notify, Tasks
from mcp_sandbox.server.tasks.table import KeyReused, TaskRow

__all__ = [
    "CAPABILITY",
    "LAST_OUTPUT",
    "RELATED_TASK",
    "TASK_TOOLS",
    "Call",
    "TaskMethods",
    "idempotency_key",
    "iso",
    "task_json",
]

TASK_TOOLS = frozenset({"run_python", "run_code"})  # the tools listed with execution.taskSupport "optional"
CAPABILITY = types.ServerTasksCapability(
    list=types.TasksListCapability(),
    cancel=types.TasksCancelCapability(),
    requests=types.ServerTasksRequestsCapability(tools=types.TasksToolsCapability(call=types.TasksCallCapability())),
)
RELATED_TASK = "io.modelcontextprotocol/related-task"
LAST_OUTPUT = "mcp-sandbox/lastOutput"  # a working task's last line of output, for a page to show as it is
_MAX_KEY = 200

T = TypeVar("T")

# Runs a tool call for a tenant, as tools/call would without a task (no progress notifications:
# nobody waits on it), its output told to the listener when there is one.
Call = Callable[[str, str, dict[str, Any] | None, OutputListener | None], Awaitable[types.CallToolResult]]


def iso(moment: float) -> str:
    stamp = datetime.datetime.fromtimestamp(moment, datetime.UTC)
    return stamp.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def task_json(row: TaskRow, *, line: str | None = None, now: float | None = None) -> dict[str, Any]:
    """The wire's ``Task`` of ``row``; given ``now``, a working one says how it is getting on: the
    time so far and ``line``, the last its run printed (also bare, in ``_meta``: :data:`LAST_OUTPUT`)."""
    task: dict[str, Any] = {
        "taskId": row.id,
        "status": row.status,
        "createdAt": iso(row.created),
        "lastUpdatedAt": iso(row.updated),
        "ttl": row.ttl_ms,
        "pollInterval": POLL_INTERVAL_MS,
    }
    if row.message is not None:
        task["statusMessage"] = row.message
    elif row.status == "working" and now is not None:
        task["statusMessage"] = working_message(row, line, now)
        if line is not None:
            task["_meta"] = {LAST_OUTPUT: line}
    return task


def idempotency_key(params: Mapping[str, Any] | None) -> str | None:
    """``_meta.idempotencyKey`` of a request's params, or None.

    Raises:
        MCPError: it is there but not a string of 1 to 200 characters.
    """
    meta = params.get("_meta") if params is not None else None
    key = meta.get("idempotencyKey") if isinstance(meta, dict) else None
    if key is None:
        return None
    if not isinstance(key, str) or not 0 < len(key) <= _MAX_KEY:
        raise MCPError(INVALID_PARAMS, f"params._meta.idempotencyKey: must be a string of 1 to {_MAX_KEY} characters")
    return key


def _ttl(task: object) -> int | None:
    if not isinstance(task, dict):
        raise MCPError(INVALID_PARAMS, 'params.task: must be an object ({} or {"ttl": milliseconds})')
    ttl = cast("dict[str, Any]", task).get("ttl")
    if ttl is not None and (isinstance(ttl, bool) or not isinstance(ttl, int) or ttl <= 0):
        raise MCPError(INVALID_PARAMS, "params.task.ttl: must be a positive integer of milliseconds")
    return ttl


def _task_id(params: types.RequestParams) -> str:
    task_id = getattr(params, "task_id", None)
    if not isinstance(task_id, str):
        raise MCPError(INVALID_PARAMS, "params.taskId: required")
    return task_id


class TaskMethods:
    """The task side of the MCP server: task-augmented calls and the ``tasks/*`` requests."""

    def __init__(self, tasks: Tasks, call: Call) -> None:
        self._tasks = tasks
        self._call = call

    async def call_as_task(self, ctx: Any) -> dict[str, Any] | None:
        """The ``CreateTaskResult`` of a ``tools/call`` that asks for a task (``params.task``); None
        for any other call (the call goes on as before)."""
        params = ctx.params if isinstance(ctx.params, dict) else None
        if params is None or "task" not in params or ctx.protocol_version in MODERN_PROTOCOL_VERSIONS:
            return None
        name = params.get("name")
        if name not in TASK_TOOLS:
            only = ", ".join(sorted(TASK_TOOLS))
            raise MCPError(METHOD_NOT_FOUND, f"tool {name!r} cannot run as a task (only {only})")
        ttl = _ttl(params["task"])
        key, line = idempotency_key(params), LastLine()
        row, _ = await self.start(
            ctx, str(name), params.get("arguments"), ttl, key, notify=True, listener=line.feed, describe=line.describe
        )
        return {"task": task_json(row)}

    async def call_once(self, ctx: Any, name: str, raw: dict[str, Any] | None, key: str) -> types.CallToolResult:
        """A blocking ``tools/call`` with idempotency ``key``: the first call's result, run once."""
        row, _ = await self.start(ctx, name, raw, None, key, notify=False)
        ended = await self.guard(self._tasks.result(row.tenant, row.id))
        return types.CallToolResult.model_validate(self.payload(ended), by_name=False)

    async def start(
        self,
        ctx: Any,
        name: str,
        raw: Any,
        ttl: int | None,
        key: str | None,
        *,
        notify: bool,
        listener: OutputListener | None = None,
        describe: Describe | None = None,
    ) -> tuple[TaskRow, bool]:
        """Start tool call ``name`` (``raw``: its arguments) as a task of the caller's tenant: its
        row, and whether it is new (False: idempotency ``key`` named a task already)."""
        tenant = tenant_of(getattr(ctx, "request", None))
        arguments = cast("dict[str, Any] | None", raw if isinstance(raw, dict) else None)
        asked = json.dumps({"name": name, "arguments": arguments}, sort_keys=True, separators=(",", ":"))
        request = hashlib.sha256(asked.encode()).hexdigest()

        async def run() -> dict[str, Any]:
            result = await self._call(tenant, name, arguments, listener)
            # resultType is the 2026-07-28 wire's: tasks/result answers in the handshake era.
            return result.model_dump(by_alias=True, mode="json", exclude_none=True, exclude={"result_type"})

        notifier = _notifier(ctx) if notify else None
        started = self._tasks.start(
            tenant, run, ttl_ms=ttl, key=key, request=request, notify=notifier, describe=describe
        )
        return await self.guard(started)

    async def get(self, ctx: Any, params: types.GetTaskRequestParams) -> dict[str, Any]:
        row, line = await self.guard(self._tasks.look(tenant_of(ctx.request), _task_id(params)))
        return task_json(row, line=line, now=time.time())

    async def result(self, ctx: Any, params: types.GetTaskPayloadRequestParams) -> dict[str, Any]:
        row = await self.guard(self._tasks.result(tenant_of(ctx.request), _task_id(params)))
        payload = dict(self.payload(row))
        payload["_meta"] = {**payload.get("_meta", {}), RELATED_TASK: {"taskId": row.id}}
        return payload

    def payload(self, row: TaskRow) -> dict[str, Any]:
        """The tool result of an ended task; raises the error a failed or cancelled one ended with."""
        stored = json.loads(row.result) if row.result is not None else {}
        if "result" in stored:
            return cast("dict[str, Any]", stored["result"])
        error = stored.get("error") or {"code": INTERNAL_ERROR, "message": row.message or row.status}
        raise MCPError(int(error["code"]), str(error["message"]), {"taskId": row.id, "status": row.status})

    async def list(self, ctx: Any, params: types.PaginatedRequestParams) -> dict[str, Any]:
        rows, following = await self.guard(self._tasks.page(tenant_of(ctx.request), params.cursor))
        answer: dict[str, Any] = {"tasks": [task_json(row) for row in rows]}
        if following is not None:
            answer["nextCursor"] = following
        return answer

    async def cancel(self, ctx: Any, params: types.CancelTaskRequestParams) -> dict[str, Any]:
        return task_json(await self.guard(self._tasks.cancel(tenant_of(ctx.request), _task_id(params))))

    @staticmethod
    async def guard(work: Awaitable[T]) -> T:
        """``work``'s value, its errors said as JSON-RPC errors."""
        try:
            return await work
        except UnknownTask as exc:  # another tenant's id reads exactly like one never made
            raise MCPError(INVALID_PARAMS, f"unknown task {exc.args[0]!r}") from None
        except KeyReused:
            raise MCPError(
                INVALID_PARAMS, "params._meta.idempotencyKey: already used for another call (another tool or arguments)"
            ) from None
        except TaskEnded as exc:
            raise MCPError(INVALID_PARAMS, f"task {exc.args[0]!r} has already ended") from None
        except ValidationError as exc:
            raise MCPError(INVALID_PARAMS, str(exc)) from None
        except WorkspaceError as exc:
            raise MCPError(INTERNAL_ERROR, f"the task store cannot answer: {exc}") from None


def _notifier(ctx: Any) -> Notify | None:
    """Sends ``notifications/tasks/status`` to the client that made the task, while it is connected."""
    session = getattr(ctx, "session", None)
    if session is None:
        return None

    async def notify(row: TaskRow) -> None:
        status = types.TaskStatusNotification(params=types.TaskStatusNotificationParams.model_validate(task_json(row)))
        await session.send_notification(status)

    return notify
