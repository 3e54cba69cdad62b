"""The MCP server object and its transports.

Over stdio the server answers ``initialize`` while its service is still opening: clients start
their servers on every launch and wait for that answer, and opening the service (importing the
engine, probing the backend, the metadata database, discovering downstream servers) takes longer
than everything before it. The CLI has given that answer before even the SDK was imported
(``stdio_early``); the server's own answer to it is dropped here (:class:`_WithoutEarlyAnswer`).
The rest of the package is imported in a worker thread meanwhile, so the event loop stays free;
``tools/list`` and ``tools/call`` wait until the service is open. A service that cannot open ends
the process at once with its error and exit status 2, as the CLI does for a refused host
(bench/startup.py).
"""

from __future__ import annotations

import importlib
import io
import logging
import os
import sys
import traceback
from types import TracebackType
from typing import TYPE_CHECKING, Any, NoReturn, cast

import anyio
import anyio.to_thread
from mcp.server.lowlevel import Server
from mcp.server.stdio import stdio_server
from mcp.shared.message import SessionMessage
from mcp.types import JSONRPCError, JSONRPCResponse

from mcp_sandbox import __version__
from mcp_sandbox.config import Config, Settings
from mcp_sandbox.errors import SandboxError
from mcp_sandbox.server.resources import list_resources, read_resource
from mcp_sandbox.server.stdio_early import INSTRUCTIONS, SERVER_NAME, EarlyStdio
from mcp_sandbox.server.stdio_wire import WireLines, WireWriter, loop_native

if TYPE_CHECKING:
    import mcp_types as types
    from mcp.shared._stream_protocols import WriteStream

    from mcp_sandbox.server.auth import TokenTable
    from mcp_sandbox.server.service import Service
    from mcp_sandbox.server.tools import ToolHandlers

__all__ = ["build_server", "serve", "serve_stdio"]

logger = logging.getLogger(__name__)


def _server(handlers: ToolHandlers | _Opening) -> Server:
    return Server(
        SERVER_NAME,
        version=__version__,
        instructions=INSTRUCTIONS,
        on_list_tools=handlers.list_tools,
        on_call_tool=handlers.call_tool,
        on_list_resources=list_resources,
        on_read_resource=read_resource,
    )


def build_server(service: Service) -> Server:
    """Build the MCP server over ``service`` (engine, bridge, workspaces)."""
    from mcp_sandbox.server.tools import ToolHandlers

    return _server(ToolHandlers(service))


class _Opening:
    """The tool handlers of a service that is still opening: each call waits until it is open."""

    def __init__(self) -> None:
        self._open = anyio.Event()
        self._handlers: ToolHandlers | None = None

    def opened(self, handlers: ToolHandlers) -> None:
        self._handlers = handlers
        self._open.set()

    async def _ready(self) -> ToolHandlers:
        if self._handlers is None:  # once open, no wait (Event.wait would still yield to the loop)
            await self._open.wait()
        assert self._handlers is not None
        return self._handlers

    async def list_tools(self, ctx: Any, params: types.PaginatedRequestParams | None) -> types.ListToolsResult:
        return await (await self._ready()).list_tools(ctx, params)

    async def call_tool(self, ctx: Any, params: types.CallToolRequestParams) -> types.CallToolResult:
        return await (await self._ready()).call_tool(ctx, params)


class _WithoutEarlyAnswer:
    """The stream to the client, less the server's own answer to the ``initialize`` answered early.

    That request reaches the server like any other, so its session is initialized as before; its
    answer (the first one with that id) is dropped, after checking it is the one already given.
    What was answered early is known before the server reads anything (``EarlyStdio.stdin``).
    """

    def __init__(self, inner: WriteStream[SessionMessage], early: EarlyStdio) -> None:
        self._inner = inner
        self._early = early
        self._dropped = False

    async def send(self, item: SessionMessage, /) -> None:
        message, answered = item.message, self._early.answered
        if (
            not self._dropped
            and answered is not None
            and isinstance(message, JSONRPCResponse | JSONRPCError)
            and type(message.id) is type(answered[0])
            and message.id == answered[0]
        ):
            self._dropped = True
            # The wire form stdio_server writes.
            own = message.model_dump_json(by_alias=True, exclude_unset=True).encode() + b"\n"
            if own != answered[1]:
                logger.error("the early answer to initialize was %r, the SDK's is %r", answered[1], own)
            return
        await self._inner.send(item)

    async def aclose(self) -> None:
        await self._inner.aclose()

    async def __aenter__(self) -> _WithoutEarlyAnswer:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()


async def serve_stdio(server: Server, early: EarlyStdio | None = None) -> None:
    """Serve MCP over this process's stdin/stdout until the client closes them.

    With ``early`` (:func:`~mcp_sandbox.server.stdio_early.begin` took the wire at start), the
    SDK's transport reads and writes the wire ``early`` holds, from the client's first byte.
    """
    if early is None:
        async with stdio_server() as (read_stream, write_stream):
            await server.run(read_stream, write_stream, server.create_initialization_options())
        return
    stdin: anyio.AsyncFile[str]
    stdout: anyio.AsyncFile[str]
    wire_in, wire_out = early.wire
    if loop_native(wire_in) and loop_native(wire_out):
        # Read and written on the event loop: no worker thread per line (see stdio_wire).
        stdin = cast("anyio.AsyncFile[str]", WireLines(wire_in, early.taken))
        stdout = cast("anyio.AsyncFile[str]", WireWriter(wire_out))
    else:
        # Text layers as the SDK's own stdio_server() builds them over fd 0 and 1.
        stdin = anyio.wrap_file(io.TextIOWrapper(early.stdin(), encoding="utf-8", errors="replace"))
        stdout = anyio.wrap_file(io.TextIOWrapper(early.stdout(), encoding="utf-8"))
    try:
        async with stdio_server(stdin, stdout) as (read_stream, write_stream):
            out = _WithoutEarlyAnswer(write_stream, early)
            await server.run(read_stream, out, server.create_initialization_options())
    finally:
        early.release()


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
            await anyio.to_thread.run_sync(importlib.import_module, "mcp_sandbox.server.tools")
            from mcp_sandbox.server.service import open_service
            from mcp_sandbox.server.tools import ToolHandlers

            async with open_service(settings, http=False) as service:
                opening.opened(ToolHandlers(service))
                await closing.wait()
        except Exception as exc:  # the server cannot serve
            _end_process(exc)

    async with anyio.create_task_group() as group:
        group.start_soon(hold_service)
        await serve_stdio(_server(opening), early)
        closing.set()  # the client is gone: close the service normally (running executions finish)


async def serve(config: Config, transport: str, early: EarlyStdio | None = None) -> None:
    """Open the service and serve ``config`` over ``transport`` (``stdio`` or ``http``) until told to stop.

    ``early``: over stdio, the wire :func:`~mcp_sandbox.server.stdio_early.begin` took at start
    (the CLI's ``serve``, which also checks ``stdio_conversation`` before that).

    Raises:
        ConfigError: HTTP beyond loopback without a token, or another refused configuration.
        BackendUnavailableError: the backend cannot serve here (see :func:`~mcp_sandbox.engine.startup.open_engine`).
    """
    settings = config.serving(transport)  # its per-tenant caps finished for this many tenants
    if transport == "stdio":
        await _serve_stdio_opening(settings, early)
        return
    from mcp_sandbox.server.auth import TokenTable
    from mcp_sandbox.server.files import file_routes
    from mcp_sandbox.server.health import health_routes
    from mcp_sandbox.server.http import auth_guard, build_http_app, check_exposure, serve_http
    from mcp_sandbox.server.metrics import metrics_route
    from mcp_sandbox.server.renew import renew_routes
    from mcp_sandbox.server.service import open_service

    tokens = TokenTable(config.tokens)
    check_exposure(settings, tokens)
    async with open_service(settings, http=True) as service:
        service.lifecycle.on_reload("tokens", lambda: _reload_tokens(settings, tokens))
        routes = [
            *file_routes(service, auth_guard(settings, tokens)),
            *renew_routes(service, auth_guard(settings, tokens)),
            *health_routes(service.ready),
            metrics_route(lambda: settings.metrics_token, service.metrics_or_fail()),
        ]
        app = build_http_app(settings, build_server(service), tokens, routes)
        await serve_http(settings, app, service.lifecycle)


async def _reload_tokens(settings: Settings, tokens: TokenTable) -> list[str]:
    """Re-read the tokens (config file's [auth], token_file) into ``tokens``; say which tenants changed."""
    from mcp_sandbox.server.auth import load_tokens

    if not tokens:
        return ["authentication was off at start; restart the server to turn it on"]
    fresh = load_tokens(settings)
    before = tokens.tenants
    tokens.replace(fresh)
    after = tokens.tenants
    return [f"{len(fresh)} tokens loaded"] + [
        f"tenant {name} {'added' if name in after else 'removed'}" for name in sorted(before ^ after)
    ]
