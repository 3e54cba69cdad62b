"""What ties the server together: the MCP server over the tools, served over stdio or HTTP.

Over stdio the server answers ``initialize`` while its service is still opening: clients start
their servers on every launch and wait for that answer, and opening the service (importing the
engine, probing the backend, the metadata database, discovering downstream servers) takes longer
than everything before it. The CLI has given that answer before even the SDK was imported
(:mod:`.transport.stdio_early`). The tools are imported in a worker thread meanwhile, so the event
loop stays free; ``tools/list`` and ``tools/call`` wait until the service is open. A service that
cannot open ends the process at once with its error and exit status 2, as the CLI does for a
refused host. Over HTTP, :func:`serve` gathers the MCP app and the routes beside it.
"""

from __future__ import annotations

import importlib
import json
import logging
import os
import sys
import traceback
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NoReturn

import anyio
import anyio.to_thread
from mcp.server.lowlevel import Server
from mcp.shared.inbound import X_MCP_HEADER_KEY

from mcp_sandbox import __version__
from mcp_sandbox.config import Config, Settings
from mcp_sandbox.errors import SandboxError
from mcp_sandbox.server.tools.resources import list_resources
from mcp_sandbox.server.transport.stdio import serve_stdio
from mcp_sandbox.server.transport.stdio_early import INSTRUCTIONS, SERVER_NAME, EarlyStdio

if TYPE_CHECKING:
    import mcp_types as types
    from starlette.types import ASGIApp

    from mcp_sandbox.server.auth.tokens import TokenTable
    from mcp_sandbox.server.lifecycle import StopSignals
    from mcp_sandbox.server.service import Service
    from mcp_sandbox.server.tools.handlers import ToolHandlers
    from mcp_sandbox.server.transport.listeners import Listeners

__all__ = ["build_server", "serve", "serve_stdio"]

logger = logging.getLogger(__name__)


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


def _bind_tasks(server: Server, handlers: ToolHandlers | _Opening) -> None:
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


def _server(handlers: ToolHandlers | _Opening) -> Server:
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

    return _server(handlers or ToolHandlers(service))


class _Opening:
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


def _end_process(exc: Exception) -> NoReturn:
    """End the process now, saying why: the stdio reader waits in a thread no cancellation reaches
    (reading stdin, which the client keeps open), so returning would hang until the client quits."""
    if isinstance(exc, SandboxError):
        print(f"mcp-sandbox: {exc}", file=sys.stderr, flush=True)
        status = 2  # as the CLI does for a refused configuration or host
    else:
        traceback.print_exception(exc, file=sys.stderr)
        status = 1
    sys.stderr.flush()
    os._exit(status)


async def _serve_stdio_opening(settings: Settings, early: EarlyStdio | None) -> None:
    """Serve stdio at once, opening the service alongside (see the module docstring)."""
    opening = _Opening()
    closing = anyio.Event()

    async def hold_service() -> None:
        try:
            await anyio.to_thread.run_sync(importlib.import_module, "mcp_sandbox.server.tools.handlers")
            from mcp_sandbox.server.service import open_service
            from mcp_sandbox.server.tools.handlers import ToolHandlers

            async with open_service(settings, http=False) as service:
                opening.opened(ToolHandlers(service))
                await closing.wait()
        except Exception as exc:  # the server cannot serve
            _end_process(exc)

    async with anyio.create_task_group() as group:
        group.start_soon(hold_service)
        await serve_stdio(_server(opening), early)
        closing.set()  # the client is gone: close the service normally (running executions finish)


async def serve(
    config: Config,
    transport: str,
    early: EarlyStdio | None = None,
    caught: list[int] | None = None,
    listeners: Listeners | None = None,
) -> None:
    """Open the service and serve ``config`` over ``transport`` (``stdio`` or ``http``) until told to stop.

    ``early``: over stdio, the wire :func:`~mcp_sandbox.server.transport.stdio_early.begin` took at start
    (the CLI's ``serve``, which also checks ``stdio_conversation`` before that). ``caught``: over HTTP,
    the stop signals the CLI recorded before this (each stops the server in order). ``listeners``:
    over HTTP, the sockets the CLI bound first (:func:`~.transport.listeners.bind_listeners`; by
    default bound here); closed when the server ends.

    Raises:
        ConfigError: HTTP beyond loopback without a token, a port that cannot be bound, or another
            refused configuration.
        BackendUnavailableError: the backend cannot serve here (see :func:`~mcp_sandbox.engine.startup.open_engine`).
    """
    settings = config.serving(transport)  # its per-tenant caps finished for this many tenants
    if transport == "stdio":
        await _serve_stdio_opening(settings, early)
        return
    from mcp_sandbox.server.auth.tokens import TokenTable
    from mcp_sandbox.server.lifecycle import stop_signals
    from mcp_sandbox.server.transport.http import check_exposure
    from mcp_sandbox.server.transport.listeners import bind_listeners

    if listeners is None:
        listeners = bind_listeners(settings.http, settings.replicas.replica_url)
    try:
        tokens = TokenTable(config.tokens)
        check_exposure(settings.http, tokens)
        if settings.replicas.replica_url is not None and settings.http.internal_port is None:
            logger.warning(
                "replica_url is set without internal_port: the public port serves /internal/ too; "
                "keep it off the balancer, or set internal_port (docs/scaling.md, the internal listener)"
            )
        with anyio.CancelScope() as starting, stop_signals(starting, caught or []) as signals:
            await _serve_http(settings, tokens, signals, listeners)
    finally:
        listeners.close()


async def _serve_http(settings: Settings, tokens: TokenTable, signals: StopSignals, listeners: Listeners) -> None:
    """Open the service and serve it over HTTP (see :func:`serve`)."""
    from mcp_sandbox.replicas.internal_route import with_internal_route
    from mcp_sandbox.server.auth.tokens import DEFAULT_TENANT
    from mcp_sandbox.server.routes.conversations import conversation_routes
    from mcp_sandbox.server.routes.files import file_routes
    from mcp_sandbox.server.routes.health import HEALTH_PATH, READY_PATH, health_routes
    from mcp_sandbox.server.routes.metrics import METRICS_PATH, metrics_route
    from mcp_sandbox.server.routes.playground import playground_routes
    from mcp_sandbox.server.routes.renew import renew_routes
    from mcp_sandbox.server.routes.runner_links import runner_link_routes
    from mcp_sandbox.server.service import open_service
    from mcp_sandbox.server.tasks.remote import serve_task
    from mcp_sandbox.server.tools.handlers import ToolHandlers
    from mcp_sandbox.server.tools.remote_views import serve_views
    from mcp_sandbox.server.transport.http import auth_guard, build_http_app, serve_http
    from mcp_sandbox.server.transport.internal import InternalListener, internal_tls, without_internal

    tls = internal_tls(settings.http)  # a bad certificate stops the start before the service opens
    internal: InternalListener | None = None
    async with open_service(settings, http=True) as service:
        service.lifecycle.on_reload("tokens", lambda: _reload_tokens(settings, tokens))
        guard = auth_guard(tokens)
        handlers = ToolHandlers(service)
        routes = [
            *file_routes(service, guard),
            *renew_routes(service, guard),
            *conversation_routes(service, guard),
            *runner_link_routes(service),
            *health_routes(service.ready),
            metrics_route(lambda: settings.auth.metrics_token, service.metrics),
            *playground_routes(),
        ]
        # Asked by address (a load balancer, a kubelet, Prometheus); they tell a page nothing:
        # health says up or down, metrics needs a token of its own.
        any_host = (HEALTH_PATH, READY_PATH, METRICS_PATH)
        app: ASGIApp = build_http_app(settings.http, build_server(service, handlers), tokens, routes, any_host)
        if (router := service.router) is not None:
            # The tenants as the tokens name them now (SIGHUP reloads them); the body is a call's, wrapped.
            known: Callable[[str], bool] = (lambda name: name in tokens.tenants) if tokens else DEFAULT_TENANT.__eq__
            # A call's body, or an HTTP upload forwarded as upload_file (base64 of up to the quota).
            upload = (settings.workspaces.quota_bytes + (1 << 20)) * 4 // 3
            limit = max(settings.http.max_request_size, upload) + (64 << 10)

            # Another replica's tasks/get or tasks/cancel of a task run here, or read or Stop of a run view held here.
            answer_task = serve_views(handlers.views, serve_task(service.tasks))

            def route(rest: ASGIApp) -> ASGIApp:
                return with_internal_route(
                    rest, router.me, router.verifier, known, handlers.forwarded, limit, answer_task
                )

            if listeners.internal:  # internal_port: /internal/ there only, over TLS with internal_cert
                app = without_internal(app)
                internal = InternalListener(settings.http, settings.log_level, route, listeners.internal, tls)
            else:
                app = route(app)
        await serve_http(settings.http, settings.log_level, app, service.lifecycle, signals, listeners.public, internal)


async def _reload_tokens(settings: Settings, tokens: TokenTable) -> list[str]:
    """Re-read the tokens (config file's [auth], token_file) into ``tokens``; say which tenants changed."""
    from mcp_sandbox.server.auth.tokens import load_tokens

    if not tokens:
        return ["authentication was off at start; restart the server to turn it on"]
    fresh = load_tokens(settings)
    before = tokens.tenants
    tokens.replace(fresh)
    after = tokens.tenants
    return [f"{len(fresh)} tokens loaded"] + [
        f"tenant {name} {'added' if name in after else 'removed'}" for name in sorted(before ^ after)
    ]
