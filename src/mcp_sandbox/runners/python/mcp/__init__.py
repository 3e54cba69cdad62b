"""mcp-sandbox's code-mode API inside the sandbox (not the MCP SDK).

- ``mcp.runtime``: ``call_tool``, ``list_servers``, ``search_tools``, ... and ``MCPError``;
- ``mcp.servers.<alias>``: the generated stubs of each server, the files under ``/tools/<alias>/``.

The runner also binds ``mcp_<alias>`` to ``mcp.servers.<alias>`` for every server a run may call.
"""

from . import runtime, servers
from .runtime import MCPError

__all__ = ["MCPError", "runtime", "servers"]
