"""The MCP face of mcp-sandbox: tools, rendering, transports (stdio, HTTP), file routes."""

from mcp_sandbox.server.app import build_server, serve, serve_stdio

__all__ = ["build_server", "serve", "serve_stdio"]
