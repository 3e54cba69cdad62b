"""The MCP face of mcp-sandbox: tools, rendering, transports (stdio, HTTP), file routes.

The names are imported on first use: ``serve`` over stdio imports ``server.stdio_early`` before
the MCP SDK, which ``server.app`` imports (see ``stdio_early``).
"""

from __future__ import annotations

import typing

if typing.TYPE_CHECKING:
    from mcp_sandbox.server.app import build_server, serve, serve_stdio

__all__ = ["build_server", "serve", "serve_stdio"]


def __getattr__(name: str) -> typing.Any:
    if name in __all__:
        from mcp_sandbox.server import app

        return getattr(app, name)
    raise AttributeError(f"module 'mcp_sandbox.server' has no attribute {name!r}")
