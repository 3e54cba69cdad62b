"""The MCP face of mcp-sandbox: the tools, the transports (stdio, HTTP), the HTTP routes, auth.

Start at :mod:`.app` (what ties them together) and :mod:`.service` (what they share). By role:
``tools/`` (the MCP tools and what a model reads back), ``transport/`` (stdio, HTTP and their
bounds), ``routes/`` (files, link renewal, health, metrics, the playground), ``auth/`` (tokens).

The names are imported on first use: ``serve`` over stdio imports ``transport.stdio_early``
before the MCP SDK, which ``server.app`` imports (see ``stdio_early``).
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
