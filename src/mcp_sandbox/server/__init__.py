"""The MCP face of mcp-sandbox: tools, rendering, transports."""

from mcp_sandbox.server.app import build_server, serve_stdio

__all__ = ["build_server", "serve_stdio"]
