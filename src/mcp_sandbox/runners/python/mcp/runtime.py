"""``mcp.runtime``: requests to the host (see ``mcp_sandbox_runtime.api`` and ``.compat``)."""

# Top-level modules inside the sandbox only; the host's type checker sees this file as
# mcp_sandbox.runners.python.mcp.runtime, where the import cannot resolve.
from mcp_sandbox_runtime.api import (  # type: ignore[import-not-found,unused-ignore]
    MCPError,
    Media,
    Resource,
    ResourceLink,
    call_tool,
    call_tool_raw,
    call_tool_sync,
    describe_server,
    discovered_servers,
    list_servers,
    list_tools,
    query_tool_docs,
    search_tools,
)
from mcp_sandbox_runtime.compat import (  # type: ignore[import-not-found,unused-ignore]
    capability_summary,
    list_loaded_server_metadata,
    list_servers_sync,
    list_tools_sync,
    query_tool_docs_sync,
    search_tool_docs,
    search_tool_docs_sync,
)
from mcp_sandbox_runtime.library import (  # type: ignore[import-not-found,unused-ignore]
    delete_memory,
    delete_tool,
    list_memories,
    list_saved_tools,
    load_memory,
    load_tool,
    save_memory,
    save_tool,
)

__all__ = [
    "MCPError",
    "Media",
    "Resource",
    "ResourceLink",
    "call_tool",
    "call_tool_raw",
    "call_tool_sync",
    "capability_summary",
    "delete_memory",
    "delete_tool",
    "describe_server",
    "discovered_servers",
    "list_loaded_server_metadata",
    "list_memories",
    "list_saved_tools",
    "list_servers",
    "list_servers_sync",
    "list_tools",
    "list_tools_sync",
    "load_memory",
    "load_tool",
    "query_tool_docs",
    "query_tool_docs_sync",
    "save_memory",
    "save_tool",
    "search_tool_docs",
    "search_tool_docs_sync",
    "search_tools",
]
