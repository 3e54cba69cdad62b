"""The earlier code-execution bridge's helper names, on top of :mod:`.api`.

Its users' code keeps working unchanged: ``capability_summary()``, the ``*_sync`` helpers that
read server metadata, ``list_loaded_server_metadata()`` and ``search_tool_docs()``, in that
bridge's shapes (server and tool *aliases* are this runtime's Python names).
"""

from __future__ import annotations

from typing import Any

from .api import ServerRef, _name, _request_sync, bridge_doc, select_tools
from .dual import DualList
from .manual import CAPABILITIES

__all__ = [
    "capability_summary",
    "list_loaded_server_metadata",
    "list_servers_sync",
    "list_tools_sync",
    "query_tool_docs_sync",
    "search_tool_docs",
    "search_tool_docs_sync",
]

_DETAILS = ("summary", "full")


def capability_summary() -> str:
    """The helper manual (also the server's capabilities resource)."""
    return CAPABILITIES


def list_servers_sync() -> tuple[str, ...]:
    """The names of the servers this run may call."""
    listed: list[dict[str, Any]] = _request_sync("list_servers", {})
    return tuple(sorted(entry["name"] for entry in listed))


def _metadata_tool(tool: dict[str, Any]) -> dict[str, Any]:
    return {
        "name": tool["name"],
        "alias": tool["python_name"],
        "description": tool.get("description", ""),
        "input_schema": tool.get("inputSchema"),
    }


def list_tools_sync(server: ServerRef) -> tuple[dict[str, Any], ...]:
    """``server``'s tools: ``({"name", "alias", "description", "input_schema"}, ...)``."""
    name = _name(server)
    tools: list[dict[str, Any]] = _request_sync("list_tools", {"server": name, "schemas": True}, name)
    return tuple(_metadata_tool(tool) for tool in tools)


def list_loaded_server_metadata() -> tuple[dict[str, Any], ...]:
    """Every server this run may call: ``({"name", "alias", "cwd", "tools": [...]}, ...)``."""
    loaded = []
    for entry in _request_sync("list_servers", {}):
        described = _request_sync("describe_server", {"server": entry["name"]}, entry["name"])
        tools = _request_sync("list_tools", {"server": entry["name"], "schemas": True}, entry["name"])
        loaded.append(
            {
                "name": entry["name"],
                "alias": entry["alias"],
                "cwd": described.get("cwd"),
                "tools": [_metadata_tool(tool) for tool in tools],
            }
        )
    return tuple(loaded)


def _detail(detail: object) -> str:
    return detail if isinstance(detail, str) and detail in _DETAILS else "summary"


def query_tool_docs_sync(server: ServerRef, tool: str | None = None, detail: str = "summary") -> list[dict[str, Any]]:
    """``[{"server", "serverAlias", "tool", "toolAlias", "description", "inputSchema"?}]`` for ``server``'s tools."""
    name = _name(server)
    described = _request_sync("describe_server", {"server": name}, name)
    tools = _request_sync("list_tools", {"server": name, "schemas": True}, name)
    chosen = select_tools(tools, tool, name)
    return [bridge_doc(described["name"], described["alias"], entry, _detail(detail)) for entry in chosen]


def _search_body(query: str, limit: int, detail: str) -> dict[str, Any]:
    return {"query": query, "limit": max(1, min(20, int(limit))), "detail": _detail(detail)}


def _hit(hit: dict[str, Any], detail: str) -> dict[str, Any]:
    entry = {"name": hit["tool"], "python_name": hit["python_name"], "description": hit.get("description")}
    if "inputSchema" in hit:
        entry["inputSchema"] = hit["inputSchema"]
    return bridge_doc(hit["server"], hit["server_alias"], entry, detail)


def search_tool_docs_sync(query: str, *, limit: int = 5, detail: str = "summary") -> list[dict[str, Any]]:
    """Tools ranked for ``query``: ``[{"server", "serverAlias", "tool", "toolAlias", "description", ...}]``."""
    body = _search_body(query, limit, detail)
    return [_hit(hit, body["detail"]) for hit in _request_sync("search_tools", body)]


def search_tool_docs(query: str, *, limit: int = 5, detail: str = "summary") -> DualList:
    """:func:`search_tool_docs_sync`'s answer; awaitable too (the earlier bridge's was a coroutine)."""
    return DualList(search_tool_docs_sync(query, limit=limit, detail=detail))
