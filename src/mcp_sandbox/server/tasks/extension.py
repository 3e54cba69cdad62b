"""The 2026-07-28 Tasks extension on the wire (``io.modelcontextprotocol/tasks``, SEP-2663).

In that revision the client declares the extension in each request's ``_meta`` client
capabilities and the server decides. A ``run_python`` or ``run_code`` call from a client that
declared it is started as a task at once (its row written first, as in the 2025-11-25 design),
and answered as the blocking call would be when it ends within ``task_after``; still running
then, it is answered with a flat ``CreateTaskResult`` (``resultType: "task"``). ``tasks/get``
inlines the final ``result`` or ``error``; while the run goes on its ``statusMessage`` says the
time so far and the last line the code printed (the extension sends no progress notifications).
``tasks/update`` is acknowledged: these tasks never ask for input, so every response names no
outstanding request and is ignored, as the extension has it. ``tasks/cancel`` stops the run and
acknowledges. ``tasks/result`` and ``tasks/list`` do not exist in this revision (-32601), and a
``tasks/*`` request from a client that did not declare the extension is refused with -32021.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from typing import Any

import anyio
import mcp_types as types
from mcp.shared.exceptions import MCPError
from mcp_types import CLIENT_CAPABILITIES_META_KEY, INTERNAL_ERROR, INVALID_PARAMS, MISSING_REQUIRED_CLIENT_CAPABILITY
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

from mcp_sandbox.server.auth.tokens import tenant_of
from mcp_sandbox.server.tasks.lastline import LastLine, working_message
from mcp_sandbox.server.tasks.lookups import POLL_INTERVAL_MS, TaskEnded
from mcp_sandbox.server.tasks.runtime import Tasks
from mcp_sandbox.server.tasks.table import TaskRow
from mcp_sandbox.server.tasks.wire import TASK_TOOLS, TaskMethods, idempotency_key, iso

__all__ = ["EXTENSION", "ExtensionMethods", "declared", "detailed_task", "modern"]

EXTENSION = "io.modelcontextprotocol/tasks"
_REQUIRED: dict[str, Any] = {"requiredCapabilities": {"extensions": {EXTENSION: {}}}}


def modern(ctx: Any) -> bool:
    """Whether the request came in the 2026-07-28 revision (the extension's era)."""
    return getattr(ctx, "protocol_version", None) in MODERN_PROTOCOL_VERSIONS


def declared(ctx: Any) -> bool:
    """Whether the request declares the extension in its ``_meta`` client capabilities."""
    params = ctx.params if isinstance(getattr(ctx, "params", None), Mapping) else {}
    meta = params.get("_meta")
    capabilities = meta.get(CLIENT_CAPABILITIES_META_KEY) if isinstance(meta, Mapping) else None
    extensions = capabilities.get("extensions") if isinstance(capabilities, Mapping) else None
    return isinstance(extensions, Mapping) and isinstance(extensions.get(EXTENSION), Mapping)


def _require(ctx: Any) -> None:
    if not declared(ctx):
        raise MCPError(
            MISSING_REQUIRED_CLIENT_CAPABILITY,
            f"Missing required client capability: declare the {EXTENSION} extension in"
            " params._meta's clientCapabilities to use tasks/*",
            _REQUIRED,
        )


def detailed_task(row: TaskRow, progress: str | None, now: float) -> dict[str, Any]:
    """The extension's ``DetailedTask`` of ``row``: the final result or error inlined once it ended."""
    task: dict[str, Any] = {
        "taskId": row.id,
        "status": row.status,
        "createdAt": iso(row.created),
        "lastUpdatedAt": iso(row.updated),
        "ttlMs": row.ttl_ms,
        "pollIntervalMs": POLL_INTERVAL_MS,
    }
    stored = json.loads(row.result) if row.result is not None else {}
    if row.status == "working":
        task["statusMessage"] = working_message(row, progress, now)
    elif row.message is not None:
        task["statusMessage"] = row.message
    if row.status == "completed":
        task["result"] = {**stored.get("result", {}), "resultType": "complete"}
    elif row.status == "failed":
        task["error"] = stored.get("error") or {"code": INTERNAL_ERROR, "message": row.message or "failed"}
    return task


class ExtensionMethods:
    """Tool calls and ``tasks/*`` requests of the 2026-07-28 revision."""

    def __init__(self, methods: TaskMethods, tasks: Tasks, task_after: float) -> None:
        self._methods = methods
        self._tasks = tasks
        self._task_after = task_after

    @staticmethod
    def applies(ctx: Any, name: str) -> bool:
        """Whether the ``tools/call`` of tool ``name`` may be answered with a task."""
        return name in TASK_TOOLS and modern(ctx) and declared(ctx)

    async def call(self, ctx: Any, name: str, raw: dict[str, Any] | None) -> types.CallToolResult | dict[str, Any]:
        """The call's result when it ends within ``task_after``, else its ``CreateTaskResult``."""
        params = ctx.params if isinstance(ctx.params, dict) else None
        key = idempotency_key(params)
        deadline = anyio.current_time() + self._task_after  # from the call's arrival: its row's write included
        line = LastLine()
        row, new = await self._methods.start(
            ctx, name, raw, None, key, notify=False, listener=line.feed, describe=line.describe
        )
        try:
            with anyio.move_on_at(deadline):
                ended = await self._methods.guard(self._tasks.result(row.tenant, row.id))
                return types.CallToolResult.model_validate(self._methods.payload(ended), by_name=False)
        except anyio.get_cancelled_exc_class():
            # The client hung up before it had the task's id: nobody can ask for it (unless by its key).
            if new and key is None:
                with anyio.CancelScope(shield=True), anyio.move_on_after(30):
                    await self._tasks.cancel(row.tenant, row.id)
            raise
        now = time.time()
        created = detailed_task(row, self._tasks.progress(row.id), now)
        return {**created, "resultType": "task"}

    async def get(self, ctx: Any, params: types.GetTaskRequestParams) -> dict[str, Any]:
        _require(ctx)
        row, progress = await self._methods.guard(self._tasks.look(tenant_of(ctx.request), params.task_id))
        return detailed_task(row, progress, time.time())

    async def update(self, ctx: Any, params: types.GetTaskRequestParams) -> dict[str, Any]:
        """Acknowledge ``tasks/update`` (``params``: its ``taskId``; ``inputResponses`` is read raw)."""
        _require(ctx)
        raw = ctx.params if isinstance(ctx.params, Mapping) else {}
        if not isinstance(raw.get("inputResponses"), Mapping):
            raise MCPError(INVALID_PARAMS, "params.inputResponses: must be an object of responses by request key")
        await self._methods.guard(self._tasks.get(tenant_of(ctx.request), params.task_id))
        return {}  # no request of these tasks is ever outstanding: every response is ignored

    async def cancel(self, ctx: Any, params: types.CancelTaskRequestParams) -> dict[str, Any]:
        _require(ctx)
        tenant, task_id = tenant_of(ctx.request), params.task_id

        async def cancel() -> None:
            try:
                await self._tasks.cancel(tenant, task_id)
            except TaskEnded:  # a cancel is a wish: one that came too late is acknowledged too
                pass

        await self._methods.guard(cancel())
        return {}
