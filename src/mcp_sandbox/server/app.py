"""The MCP server object and its transports."""

from __future__ import annotations

import dataclasses
from typing import Any

from mcp.server.lowlevel import Server

from mcp_sandbox import __version__
from mcp_sandbox.config import TENANT_DEFAULTS, Settings
from mcp_sandbox.server.auth import TokenTable
from mcp_sandbox.server.resources import list_resources, read_resource
from mcp_sandbox.server.service import Service, open_service
from mcp_sandbox.server.tools import ToolHandlers

__all__ = ["build_server", "serve", "serve_stdio", "with_tenants"]

INSTRUCTIONS = (
    "mcp-sandbox runs untrusted code in an OS-level sandbox. Use run_python (or run_code) to compute, "
    "parse, or transform data; print what you need to read back. Pass a conversationId to keep files "
    "in /workspace and variables between runs."
)


def build_server(service: Service) -> Server:
    """Build the MCP server over ``service`` (engine, bridge, workspaces)."""
    handlers = ToolHandlers(service)
    return Server(
        "mcp-sandbox",
        version=__version__,
        instructions=INSTRUCTIONS,
        on_list_tools=handlers.list_tools,
        on_call_tool=handlers.call_tool,
        on_list_resources=list_resources,
        on_read_resource=read_resource,
    )


async def serve_stdio(server: Server) -> None:
    """Serve MCP over this process's stdin/stdout until the client closes them."""
    from mcp.server.stdio import stdio_server

    async with stdio_server() as (read_stream, write_stream):
        await server.run(read_stream, write_stream, server.create_initialization_options())


def with_tenants(settings: Settings, tenants: int) -> Settings:
    """``settings`` for a server with ``tenants`` tenants: the per-tenant caps not given are
    ``TENANT_DEFAULTS`` with several tenants; with one (stdio, or HTTP with one token or none),
    the server's own, so they take nothing from its capacity."""
    server_wide = {
        "tenant_concurrent_runs": settings.max_concurrent_runs,
        "tenant_queued_runs": settings.max_queued_runs,
        "tenant_sessions": settings.max_sessions,
        "tenant_workspaces_bytes": settings.max_workspaces_bytes,
        "tenant_http_sessions": settings.max_http_sessions,
    }
    defaults = TENANT_DEFAULTS if tenants > 1 else server_wide
    chosen: dict[str, Any] = {name: value for name, value in defaults.items() if getattr(settings, name) is None}
    return dataclasses.replace(settings, **chosen)


def _check_stdio_conversation(settings: Settings) -> None:
    from mcp_sandbox.errors import ConfigError, ValidationError
    from mcp_sandbox.workspace import check_conversation_id

    if settings.stdio_conversation is not None:
        try:
            check_conversation_id(settings.stdio_conversation)
        except ValidationError as exc:
            raise ConfigError(f"stdio_conversation: {exc.message}") from exc


async def serve(settings: Settings, transport: str) -> None:
    """Open the service and serve it over ``transport`` (``stdio`` or ``http``) until told to stop.

    Raises:
        ConfigError: HTTP beyond loopback without a token, or another refused configuration.
    """
    if transport == "stdio":
        _check_stdio_conversation(settings)
        async with open_service(with_tenants(settings, 1), http=False) as service:
            await serve_stdio(build_server(service))
        return
    from mcp_sandbox.server.auth import load_tokens
    from mcp_sandbox.server.files import file_routes
    from mcp_sandbox.server.health import health_routes
    from mcp_sandbox.server.http import auth_guard, build_http_app, check_exposure, serve_http
    from mcp_sandbox.server.metrics import metrics_route
    from mcp_sandbox.server.renew import renew_routes

    loaded = load_tokens(settings)
    tokens = TokenTable(loaded)
    check_exposure(settings, tokens)
    settings = with_tenants(settings, len({token.tenant for token in loaded}))
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
