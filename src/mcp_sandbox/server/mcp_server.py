"""The MCP server over the tools: its handlers, middleware and capabilities, before any transport.

:func:`build_server` makes it over an open service's tool handlers; over stdio the server answers
while the service is still opening, over :class:`Opening` handlers that wait until it is open
(:mod:`.app`). Served by :mod:`.app` over stdio or Streamable HTTP.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import anyio
from mcp.server.lowlevel import Server
from mcp.shared.inbound import X_MCP_HEADER_KEY

from mcp_sandbox import __version__
from mcp_sandbox.server.tools.resources import list_resources
from mcp_sandbox.server.transport.stdio_early import INSTRUCTIONS, SERVER_NAME

if TYPE_CHECKING:
    import mcp_types as types

    from mcp_sandbox.server.service import Service
    from mcp_sandbox.server.tools.handlers import ToolHandlers

__all__ = ["Opening", "build_server", "mcp_server"]


async def _named_call_errors(ctx: Any, call_next: Any) -> Any:
    """Refuse malformed ``tools/call`` params naming the field (the SDK says "Invalid request parameters").

    The SDK validates the params before the handler runs; only when something under this layer
    fails validation are they validated here, to name the field (or to let the failure go on
    when the params are valid and the handler's own validation failed). A call to be made a
    task is checked first: the tasks layer under this one takes it before the SDK's check.
    """
    if ctx.method != "tools/call":
        return await call_next(ctx)
    from pydantic import ValidationError

    if isinstance(ctx.params, dict) and "task" in ctx.params:
        _refuse_malformed_call(ctx.params)
        return await call_next(ctx)
    try:
        return await call_next(ctx)
    except ValidationError:
        _refuse_malformed_call(ctx.params)
        raise


def _refuse_malformed_call(params: Any) -> None:
    """Raise ``INVALID_PARAMS`` naming each field of ``params`` that a ``tools/call`` cannot take."""
    import mcp_types as types
    from mcp.shared.exceptions import MCPError
    from pydantic import ValidationError

    try:
        types.CallToolRequestParams.model_validate({} if params is None else params, by_name=False)
    except ValidationError as exc:
        problems = "; ".join(
            f"params.{'.'.join(str(part) for part in error['loc'])}: {error['msg']}" for error in exc.errors()
        )
        raise MCPError(types.INVALID_PARAMS, f"tools/call: {problems}") from None


class _TasksServer(Server[Any]):
    """The SDK's server, advertising ``capabilities.tasks`` in the handshake era and the tasks
    extension in the 2026-07-28 revision (it derives capabilities from its handlers, and tasks
    have none there: :mod:`.tasks.wire`, :mod:`.tasks.extension`)."""

    def get_capabilities(self, *args: Any, **kwargs: Any) -> types.ServerCapabilities:
        from mcp_types.version import MODERN_PROTOCOL_VERSIONS

        from mcp_sandbox.server.tasks.extension import EXTENSION
        from mcp_sandbox.server.tasks.wire import CAPABILITY

        capabilities = super().get_capabilities(*args, **kwargs)
        if kwargs.get("protocol_version") in MODERN_PROTOCOL_VERSIONS:
            extensions = {**(capabilities.extensions or {}), EXTENSION: {}}
            return capabilities.model_copy(update={"extensions": extensions})
        return capabilities.model_copy(update={"tasks": CAPABILITY})


def _bind_tasks(server: Server, handlers: ToolHandlers | Opening) -> None:
    """``tools/call`` with ``task`` answered at once, and the ``tasks/*`` requests of each era
    (:mod:`.tasks.wire` in the handshake era, :mod:`.tasks.extension` in the 2026-07-28 one)."""
    import mcp_types as types
    from mcp.shared.exceptions import MCPError
    from mcp_types.version import MODERN_PROTOCOL_VERSIONS

    def modern(ctx: Any) -> bool:
        return ctx.protocol_version in MODERN_PROTOCOL_VERSIONS

    async def task_calls(ctx: Any, call_next: Any) -> Any:
        if ctx.method == "tools/call" and isinstance(ctx.params, dict) and "task" in ctx.params:
            created = await (await handlers.ready()).call_as_task(ctx)
            if created is not None:
                return created
        return await call_next(ctx)

    def bound(method: str, *, legacy: bool = True, extension: bool = True) -> Any:
        async def handle(ctx: Any, params: Any) -> Any:
            ready = await handlers.ready()
            if modern(ctx) and extension:
                return await getattr(ready.extension, method)(ctx, params)
            if not modern(ctx) and legacy:
                return await getattr(ready.tasks, method)(ctx, params)
            raise MCPError(types.METHOD_NOT_FOUND, "Method not found", f"tasks/{method}")  # not in this era

        return handle

    server.middleware.append(task_calls)
    server.add_request_handler("tasks/get", types.GetTaskRequestParams, bound("get"))
    server.add_request_handler("tasks/result", types.GetTaskPayloadRequestParams, bound("result", extension=False))
    server.add_request_handler("tasks/list", types.PaginatedRequestParams, bound("list", extension=False))
    server.add_request_handler("tasks/cancel", types.CancelTaskRequestParams, bound("cancel"))
    # taskId typed; inputResponses read from the raw params (the SDK has no type for them)
    server.add_request_handler("tasks/update", types.GetTaskRequestParams, bound("update", legacy=False))


def mcp_server(handlers: ToolHandlers | Opening) -> Server:
    """The MCP server over ``handlers``: the tools, their resources, the tasks of both eras, and
    this server's own middleware (request spans, the named refusal of a malformed ``tools/call``)."""
    import mcp_types as types
    from mcp.server._otel import OpenTelemetryMiddleware

    from mcp_sandbox.tracing.requests import RequestSpans

    server = _TasksServer(
        SERVER_NAME,
        version=__version__,
        instructions=INSTRUCTIONS,
        on_list_tools=handlers.list_tools,
        # Without it, the Streamable HTTP transport runs the whole tools/list for every tools/call
        # to check its Mcp-Param-* headers against the tool's schema.
        get_tool_input_schema=_ParamHeaderSchemas(handlers.input_schema),
        on_list_resources=list_resources,
        on_read_resource=handlers.read_resource,
    )
    # Bound here, not as on_call_tool: a call may be answered with the tasks extension's result.
    server.add_request_handler("tools/call", types.CallToolRequestParams, handlers.call_tool)
    # The SDK's span of each message, made by this server's middleware for less (mcp_sandbox.tracing.requests).
    server.middleware[:] = [
        RequestSpans() if isinstance(layer, OpenTelemetryMiddleware) else layer for layer in server.middleware
    ]
    server.middleware.append(_named_call_errors)
    _bind_tasks(server, handlers)
    return server


def build_server(service: Service, handlers: ToolHandlers | None = None) -> Server:
    """Build the MCP server over ``service`` (engine, bridge, workspaces), or over ``handlers`` of it."""
    from mcp_sandbox.server.tools.handlers import ToolHandlers

    return mcp_server(handlers or ToolHandlers(service))


class Opening:
    """The tool handlers of a service that is still opening: each call waits until it is open."""

    def __init__(self) -> None:
        self._open = anyio.Event()
        self._handlers: ToolHandlers | None = None

    def opened(self, handlers: ToolHandlers) -> None:
        self._handlers = handlers
        self._open.set()

    async def ready(self) -> ToolHandlers:
        if self._handlers is None:  # once open, no wait (Event.wait would still yield to the loop)
            await self._open.wait()
        assert self._handlers is not None
        return self._handlers

    async def list_tools(self, ctx: Any, params: types.PaginatedRequestParams | None) -> types.ListToolsResult:
        return await (await self.ready()).list_tools(ctx, params)

    async def call_tool(self, ctx: Any, params: types.CallToolRequestParams) -> types.CallToolResult | dict[str, Any]:
        return await (await self.ready()).call_tool(ctx, params)

    def input_schema(self, name: str) -> dict[str, Any] | None:
        """As :meth:`.ToolHandlers.input_schema`; None while opening (no tool declares an ``Mcp-Param`` header)."""
        return None if self._handlers is None else self._handlers.input_schema(name)

    async def read_resource(self, ctx: Any, params: types.ReadResourceRequestParams) -> types.ReadResourceResult:
        return await (await self.ready()).read_resource(ctx, params)


class _ParamHeaderSchemas:
    """The SDK's ``get_tool_input_schema``: a tool's input schema where it declares ``Mcp-Param-*``
    headers (``x-mcp-header``), else None.

    The SDK walks the whole schema on every ``tools/call`` over Streamable HTTP (2026-07-28) to
    compare the headers it declares with the arguments; a schema that declares none can reject
    nothing, and None says so without the walk. A tool's schema is the same for every caller and
    for the handlers' life, so the answer is kept per tool name (names of no tool are not kept).
    """

    def __init__(self, lookup: Callable[[str], dict[str, Any] | None]) -> None:
        self._lookup = lookup
        self._known: dict[str, dict[str, Any] | None] = {}

    def __call__(self, name: str) -> dict[str, Any] | None:
        if name in self._known:
            return self._known[name]
        schema = self._lookup(name)
        if schema is None:  # no such tool, or the service is still opening
            return None
        # Anywhere in the schema, even as a property's name: the SDK's own check decides then.
        self._known[name] = schema if f'"{X_MCP_HEADER_KEY}"' in json.dumps(schema) else None
        return self._known[name]
