"""Serving the MCP server (:mod:`.mcp_server`) over stdio or HTTP, and what ties the service to it.

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
import logging
import os
import sys
import traceback
from collections.abc import Callable
from typing import TYPE_CHECKING, NoReturn

import anyio
import anyio.to_thread

from mcp_sandbox.config import Config, Settings
from mcp_sandbox.errors import SandboxError
from mcp_sandbox.server.mcp_server import Opening, build_server, mcp_server
from mcp_sandbox.server.transport.stdio import serve_stdio
from mcp_sandbox.server.transport.stdio_early import EarlyStdio

if TYPE_CHECKING:
    from starlette.types import ASGIApp

    from mcp_sandbox.server.auth.tokens import TokenTable
    from mcp_sandbox.server.lifecycle import StopSignals
    from mcp_sandbox.server.transport.listeners import Listeners

__all__ = ["build_server", "serve", "serve_stdio"]

logger = logging.getLogger(__name__)


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
    opening = Opening()
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
        await serve_stdio(mcp_server(opening), early)
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
