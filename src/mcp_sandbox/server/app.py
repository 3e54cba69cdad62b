"""The MCP server object and its transports."""

from __future__ import annotations

from mcp.server.lowlevel import Server

from mcp_sandbox import __version__
from mcp_sandbox.config import Settings
from mcp_sandbox.server.resources import list_resources, read_resource
from mcp_sandbox.server.service import Service, open_service
from mcp_sandbox.server.tools import ToolHandlers

__all__ = ["build_server", "serve", "serve_stdio"]

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
        async with open_service(settings, http=False) as service:
            await serve_stdio(build_server(service))
        return
    from mcp_sandbox.server.auth import TokenTable, load_tokens
    from mcp_sandbox.server.files import file_routes
    from mcp_sandbox.server.http import auth_guard, build_http_app, check_exposure, serve_http
    from mcp_sandbox.server.renew import renew_routes

    tokens = TokenTable(load_tokens(settings))
    check_exposure(settings, tokens)
    async with open_service(settings, http=True) as service:
        routes = [
            *file_routes(service, auth_guard(settings, tokens)),
            *renew_routes(service, auth_guard(settings, tokens)),
        ]
        await serve_http(settings, build_http_app(settings, build_server(service), tokens, routes))
