"""MCP over HTTP: Streamable HTTP at ``/mcp``, legacy SSE at ``/sse`` and ``/mcp``, beside other routes.

Security at this layer: static bearer tokens per tenant (401 with ``WWW-Authenticate: Bearer``
and no OAuth discovery, see :mod:`~mcp_sandbox.server.auth.bearer`), Host/Origin validation against DNS rebinding (on
every route, :mod:`.hosts`), request body limits, and a refusal to listen beyond
loopback without a token. Which session manager serves a ``/mcp`` request (sessions and SSE for
MCP clients, stateless plain JSON for curl) is :mod:`.mcp_route`'s business. Against slow or
greedy clients and tenants: connection, header and body bounds (:mod:`.limits`) and MCP sessions
per tenant with an idle life (:mod:`.http_sessions`).
"""

from __future__ import annotations

import ipaddress
import logging
import socket
from collections.abc import Callable, Collection, Sequence
from urllib.parse import urlsplit

import uvicorn
from mcp.server.auth.middleware.auth_context import AuthContextMiddleware
from mcp.server.auth.middleware.bearer_auth import BearerAuthBackend
from mcp.server.lowlevel import Server
from mcp.server.sse import SseServerTransport
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from mcp.server.transport_security import TransportSecuritySettings
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.authentication import AuthenticationMiddleware
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Mount, Route
from starlette.types import ASGIApp, Receive, Scope, Send

from mcp_sandbox.config import HttpSettings
from mcp_sandbox.errors import ConfigError, UnavailableError
from mcp_sandbox.server.auth.bearer import RequireBearer, oauth_discovery_routes
from mcp_sandbox.server.auth.tokens import TokenTable, tenant_of
from mcp_sandbox.server.lifecycle import DrainingServer, Lifecycle, StopSignals
from mcp_sandbox.server.transport.hosts import HostCheck
from mcp_sandbox.server.transport.http_sessions import SessionQuota, SseIdle
from mcp_sandbox.server.transport.internal import InternalListener
from mcp_sandbox.server.transport.limits import (
    SlowBodyGuard,
    install_log_limits,
    raise_open_files_limit,
    uvicorn_limits,
)
from mcp_sandbox.server.transport.mcp_route import McpRoute
from mcp_sandbox.server.transport.outages import answer_unavailable

__all__ = [
    "auth_guard",
    "build_http_app",
    "check_exposure",
    "is_loopback",
    "serve_http",
    "transport_security",
]

logger = logging.getLogger(__name__)

MCP_PATH = "/mcp"
SSE_PATH = "/sse"
EVENTS_PATH = "/mcp/events"  # the earlier code runner's SSE route
MESSAGES_PATH = "/messages/"

_LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "[::1]")
_WILDCARDS = ("0.0.0.0", "::", "")


def is_loopback(host: str) -> bool:
    """Whether binding ``host`` keeps the server reachable from this machine only."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def check_exposure(http: HttpSettings, tokens: TokenTable) -> None:
    """Refuse configurations that would expose the server.

    Raises:
        ConfigError: a non-loopback address without a token, or a wildcard address with no
            ``allowed_hosts``/``public_url`` to validate Host headers against.
    """
    if is_loopback(http.host):
        return
    if not tokens:
        raise ConfigError(
            f"refusing to listen on {http.host}, beyond loopback, without a bearer token: "
            "set MCP_SANDBOX_TOKEN or [auth] tokens in the config file"
        )
    if http.host in _WILDCARDS and not http.allowed_hosts and http.public_url is None:
        raise ConfigError(
            f"listening on {http.host!r} (every address): set public_url or allowed_hosts to the names "
            "clients use, so Host headers can be checked (allowed_hosts = '*' turns the check off)"
        )


def transport_security(http: HttpSettings) -> TransportSecuritySettings:
    """Which Host and Origin headers the server accepts (DNS-rebinding protection), on every route."""
    if "*" in http.allowed_hosts:
        return TransportSecuritySettings(enable_dns_rebinding_protection=False)
    hosts: list[str] = []
    origins: list[str] = []
    names = list(_LOOPBACK_HOSTS)
    if http.host not in _WILDCARDS:
        names.append(f"[{http.host}]" if ":" in http.host else http.host)
    for name in names:
        hosts += [name, f"{name}:*"]
        origins += [f"http://{name}", f"http://{name}:*", f"https://{name}", f"https://{name}:*"]
    if http.public_url is not None:
        parts = urlsplit(http.public_url)
        hosts.append(parts.netloc)
        origins.append(f"{parts.scheme}://{parts.netloc}")
    hosts += http.allowed_hosts
    origins += http.allowed_origins
    return TransportSecuritySettings(
        enable_dns_rebinding_protection=True,
        allowed_hosts=list(dict.fromkeys(hosts)),
        allowed_origins=list(dict.fromkeys(origins)),
    )


class _Endpoint:
    """A plain ASGI callable as a route endpoint (Starlette treats functions as request handlers)."""

    def __init__(self, app: ASGIApp) -> None:
        self._app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self._app(scope, receive, send)


def _sse_routes(
    http: HttpSettings, server: Server, guard: Callable[[ASGIApp], ASGIApp], quota: SessionQuota
) -> tuple[ASGIApp, list[BaseRoute]]:
    """The deprecated HTTP+SSE transport, for clients that predate Streamable HTTP (sessions under ``quota``,
    ended after ``http_session_ttl`` without a message): its handshake (``GET`` opens the stream, whose
    first event names the URL to post to), unguarded for ``/mcp`` to serve too, and its guarded routes:
    ``/sse``, ``/mcp/events`` (the earlier code runner's) and the messages."""
    sse = SseServerTransport(
        MESSAGES_PATH,
        security_settings=transport_security(http),
        max_request_body_size=http.max_request_size,
    )
    idle = SseIdle(http.http_session_ttl)

    async def connect(scope: Scope, receive: Receive, send: Send) -> None:
        tenant = tenant_of(Request(scope))
        refused = quota.refusal(tenant)
        if refused is not None:
            await refused(scope, receive, send)
            return
        with quota.sse_session(tenant):
            async with idle.watched(send) as stream:
                async with sse.connect_sse(scope, receive, stream.send) as (reader, writer):
                    await server.run(reader, writer, server.create_initialization_options())
        if not stream.completed:
            await Response()(scope, receive, send)

    return connect, [
        Route(SSE_PATH, endpoint=guard(connect), methods=["GET"]),
        Route(EVENTS_PATH, endpoint=guard(connect), methods=["GET"]),
        Mount(MESSAGES_PATH, app=guard(idle.messages(sse.handle_post_message))),
    ]


def auth_guard(tokens: TokenTable) -> Callable[[ASGIApp], ASGIApp]:
    """Wrap an ASGI app so it answers 401 (with ``WWW-Authenticate``) to requests without a valid token."""
    return RequireBearer if tokens else _Endpoint


def build_http_app(
    http: HttpSettings,
    server: Server,
    tokens: TokenTable,
    extra_routes: Sequence[BaseRoute] = (),
    any_host: Collection[str] = (),
) -> Starlette:
    """The ASGI app: MCP (Streamable HTTP and SSE) and ``extra_routes`` (files, health, the playground...).

    ``extra_routes`` see ``request.user`` set by the bearer middleware; they require it
    themselves where they need it, wrapped in :func:`auth_guard` (as the upload route is).
    Every path but ``any_host`` has its Host and Origin checked first (:mod:`.hosts`).
    """
    security = transport_security(http)
    guard = auth_guard(tokens)
    stateful = StreamableHTTPSessionManager(
        server,
        security_settings=security,
        max_request_body_size=http.max_request_size,
        max_sessions=http.max_http_sessions,
        session_idle_timeout=http.http_session_ttl,
    )
    quota = SessionQuota(http.tenant_http_sessions or http.max_http_sessions)
    quota.attach(stateful)
    legacy_sse, sse_routes = _sse_routes(http, server, guard, quota)
    mcp = McpRoute(server, stateful, security, http.max_request_size, legacy_sse)
    middleware = [Middleware(HostCheck, security=security, exempt=any_host)]
    if tokens:
        middleware += [
            Middleware(AuthenticationMiddleware, backend=BearerAuthBackend(tokens)),
            Middleware(AuthContextMiddleware),
        ]
    routes: list[BaseRoute] = [
        Route(MCP_PATH, endpoint=guard(mcp)),
        *sse_routes,
        *extra_routes,
        *oauth_discovery_routes(),
    ]
    return Starlette(
        routes=routes,
        middleware=middleware,
        exception_handlers={UnavailableError: answer_unavailable},  # every route's outage: 503, Retry-After
        lifespan=lambda _app: mcp.run(),
    )


async def serve_http(
    http: HttpSettings,
    log_level: str,
    app: ASGIApp,
    lifecycle: Lifecycle,
    signals: StopSignals,
    listeners: list[socket.socket],
    internal: InternalListener | None = None,
) -> None:
    """Serve ``app`` on ``listeners`` (:func:`~.listeners.bind_listeners`), and ``internal`` beside it
    (:mod:`.internal`), until SIGINT/SIGTERM: SIGTERM drains
    the ``lifecycle``'s runs first (SIGINT, or a second SIGTERM, stops them at once) and SIGHUP
    reloads (see :mod:`~mcp_sandbox.server.lifecycle`); ``signals`` took them before the server
    started (see :func:`~mcp_sandbox.server.lifecycle.stop_signals`). Connections, headers and
    bodies are bounded (see :mod:`.limits`).
    """
    raise_open_files_limit()
    install_log_limits()
    config = uvicorn.Config(
        SlowBodyGuard(app, http.body_timeout, http.body_min_rate),
        host=http.host,
        port=http.port,
        log_level=log_level.lower(),
        lifespan="on",
        server_header=False,
        timeout_graceful_shutdown=round(http.shutdown_grace),
        **uvicorn_limits(http),
    )
    also = internal.start if internal is not None else None
    server = DrainingServer(config, lifecycle, http.shutdown_grace, signals, also)
    await server.serve_draining(listeners)
