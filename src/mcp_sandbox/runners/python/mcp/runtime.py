"""``mcp.runtime``: requests to the host (see ``mcp_sandbox_runtime.api``)."""

# Top-level modules inside the sandbox only; the host's type checker sees this file as
# mcp_sandbox.runners.python.mcp.runtime, where the import cannot resolve.
from mcp_sandbox_runtime.api import (  # type: ignore[import-not-found,unused-ignore]
    MCPError,
    Media,
    Resource,
    ResourceLink,
    call_tool,
    call_tool_sync,
    describe_server,
    discovered_servers,
    list_servers,
    list_tools,
    query_tool_docs,
    search_tools,
)

__all__ = [
    "MCPError",
    "Media",
    "Resource",
    "ResourceLink",
    "call_tool",
    "call_tool_sync",
    "describe_server",
    "discovered_servers",
    "list_servers",
    "list_tools",
    "query_tool_docs",
    "search_tools",
]
