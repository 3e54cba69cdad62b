"""The helper manual: ``runtime.capability_summary()`` inside the sandbox, and the server's
capabilities resource (``resources/read``), which the earlier bridge served at the same URI."""

from __future__ import annotations

__all__ = ["CAPABILITIES", "CAPABILITIES_URI"]

CAPABILITIES_URI = "resource://mcp-server-code-execution-mode/capabilities"

CAPABILITIES = f"""\
# mcp-sandbox: code mode helpers

Python (and TypeScript) runs in an OS sandbox: no network unless granted, only /workspace
(also /data) and /tmp writable. Pass `servers=[...]` to run_python to call those MCP servers.

## Discover
- `from mcp import runtime` (also `import mcp.runtime as runtime`).
- `runtime.discovered_servers()` the names of every configured server (`discovered_server_entries()`
  with aliases and whether this run may call each); `runtime.list_servers()` the ones this run may
  call; `runtime.describe_server(name)` one server, its tools and its `cwd`.
- `runtime.search_tools("query", detail="summary")` ranked tools of every server;
  `runtime.query_tool_docs(server, tool=None, detail="summary"|"full")` their documentation.
- Read `/tools/<alias>/<tool>.py`: each tool's signature, documentation and result type.

## Call
- `await mcp_<alias>.<tool>(...)` or `mcp.servers.<alias>.<tool>(...)`; `<tool>_sync(...)` in plain scripts.
- `await runtime.call_tool(server, tool, {{...}})` returns the tool's structured result (or its
  content); `await runtime.call_tool_raw(server, tool, {{...}})` the whole result as sent (what
  every call returns when the server's `tool_results` setting is `raw`).
- A failed call raises `runtime.MCPError` (a `RuntimeError`).

## The earlier bridge's names (they keep working)
`mcp_servers[name]`, `LOADED_MCP_SERVERS`, `runtime.capability_summary()`,
`runtime.list_loaded_server_metadata()`, `runtime.search_tool_docs(query, limit=5)`,
`runtime.list_servers_sync()`, `runtime.list_tools_sync(server)`,
`runtime.query_tool_docs_sync(...)`, `runtime.search_tool_docs_sync(...)`,
`await mcp_<alias>.list_tools()`, `await runtime.list_servers()`, `await runtime.list_tools(server)`.

## State
Pass the same `conversationId` to keep files in /workspace and variables between runs.

## Persist (every later run of yours, any conversation)
`save_tool(func)` then `saved.<name>(...)`; `save_memory(key, value)` then `load_memory(key)`;
`list_saved_tools()`, `list_memories()`, `delete_tool(name)`, `delete_memory(key)`.
Read-only files: /tools/_library/tools/, /tools/_library/memories/.

Resource URI: {CAPABILITIES_URI}
"""
