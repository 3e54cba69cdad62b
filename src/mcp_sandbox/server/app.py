"""The MCP server object and its transports."""

from __future__ import annotations

from mcp.server.lowlevel import Server

from mcp_sandbox import __version__
from mcp_sandbox.bridge.mediator import Bridge
from mcp_sandbox.config import Settings
from mcp_sandbox.engine import Engine
from mcp_sandbox.server.tools import ToolHandlers

__all__ = ["build_server", "serve_stdio"]

INSTRUCTIONS = (
    "mcp-sandbox runs untrusted code in an OS-level sandbox. Use run_python to compute, parse, "
    "or transform data; print what you need to read back."
)


def build_server(settings: Settings, engine: Engine, bridge: Bridge | None = None) -> Server:
    """Build the MCP server for ``engine``; with a ``bridge``, sandboxed code can call its servers."""
    handlers = ToolHandlers(settings, engine, bridge)
    return Server(
        "mcp-sandbox",
        version=__version__,
        instructions=INSTRUCTIONS,
        on_list_tools=handlers.list_tools,
        on_call_tool=handlers.call_tool,
    )


async def serve_stdio(server: Server) -> None:
    """Serve MCP over this process's stdin/stdout until the client closes them."""
    from mcp.server.stdio import stdio_server

    async with stdio_server() as (read_stream, write_stream):
        await server.run(read_stream, write_stream, server.create_initialization_options())
