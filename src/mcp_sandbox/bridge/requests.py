"""The requests sandboxed code sends to the host (a CALL frame's body), decoded once, typed.

A request comes from the sandbox: hostile input. :func:`decode_request` checks its ``op`` and
every field's type and raises :class:`InvalidRequest` (answered with an ``invalid`` error, the
run goes on); past it the mediator handles typed objects only. The sandbox's side of these
shapes is ``mcp_sandbox_runtime/api.py`` (Python) and ``runners/typescript/mcp.ts``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeGuard

from mcp_sandbox.bridge.search import DETAILS, MAX_SEARCH_RESULTS, Detail

__all__ = [
    "CallTool",
    "DescribeServer",
    "DiscoveredServers",
    "InvalidRequest",
    "ListServers",
    "ListTools",
    "QueryToolDocs",
    "Request",
    "SearchTools",
    "decode_request",
]


class InvalidRequest(Exception):
    """The sandbox sent a malformed request."""


@dataclass(frozen=True, slots=True)
class CallTool:
    server: str
    tool: str
    arguments: dict[str, Any]
    raw: bool = False  # the whole result, a failed one too (the earlier bridge's shape)


@dataclass(frozen=True, slots=True)
class ListServers:
    pass


@dataclass(frozen=True, slots=True)
class DiscoveredServers:
    pass


@dataclass(frozen=True, slots=True)
class DescribeServer:
    server: str


@dataclass(frozen=True, slots=True)
class ListTools:
    server: str
    schemas: bool = False  # each tool's full definition (the earlier bridge's shape)


@dataclass(frozen=True, slots=True)
class SearchTools:
    query: str
    detail: Detail
    limit: int


@dataclass(frozen=True, slots=True)
class QueryToolDocs:
    server: str
    tool: str | None
    detail: Detail


Request = CallTool | ListServers | DiscoveredServers | DescribeServer | ListTools | SearchTools | QueryToolDocs


def _server(body: Mapping[str, Any]) -> str:
    name = body.get("server")
    if not isinstance(name, str):
        raise InvalidRequest("`server` must be a server name")
    return name


def _is_detail(value: object) -> TypeGuard[Detail]:
    return value in DETAILS


def _detail(body: Mapping[str, Any]) -> Detail:
    detail = body.get("detail", "summary")
    if not _is_detail(detail):
        raise InvalidRequest(f"`detail` must be one of {', '.join(DETAILS)}")
    return detail


def _call_tool(body: Mapping[str, Any]) -> CallTool:
    server = _server(body)
    tool, arguments = body.get("tool"), body.get("arguments", {})
    if not isinstance(tool, str) or not tool:
        raise InvalidRequest("`tool` must be a tool name")
    if not isinstance(arguments, dict):
        raise InvalidRequest("`arguments` must be an object")
    return CallTool(server, tool, arguments, _flag(body, "raw"))


def _flag(body: Mapping[str, Any], name: str) -> bool:
    value = body.get(name, False)
    if not isinstance(value, bool):
        raise InvalidRequest(f"`{name}` must be true or false")
    return value


def _search_tools(body: Mapping[str, Any]) -> SearchTools:
    query, limit = body.get("query"), body.get("limit", 10)
    if not isinstance(query, str):
        raise InvalidRequest("`query` must be a string")
    detail = _detail(body)
    if not isinstance(limit, int) or isinstance(limit, bool) or not 1 <= limit <= MAX_SEARCH_RESULTS:
        raise InvalidRequest(f"`limit` must be an integer from 1 to {MAX_SEARCH_RESULTS}")
    return SearchTools(query, detail, limit)


def _query_tool_docs(body: Mapping[str, Any]) -> QueryToolDocs:
    server, tool = _server(body), body.get("tool")
    if tool is not None and not isinstance(tool, str):
        raise InvalidRequest("`tool` must be a tool name")
    return QueryToolDocs(server, tool, _detail(body))


_DECODERS: dict[str, Callable[[Mapping[str, Any]], Request]] = {
    "call_tool": _call_tool,
    "list_servers": lambda _: ListServers(),
    "discovered_servers": lambda _: DiscoveredServers(),
    "describe_server": lambda body: DescribeServer(_server(body)),
    "list_tools": lambda body: ListTools(_server(body), _flag(body, "schemas")),
    "search_tools": _search_tools,
    "query_tool_docs": _query_tool_docs,
}


def decode_request(body: Mapping[str, Any]) -> Request:
    """The typed request in a CALL frame's ``body`` (its ``op`` and fields).

    Raises:
        InvalidRequest: an unknown ``op``, a missing field or one of the wrong type.
    """
    op = body.get("op")
    decoder = _DECODERS.get(op) if isinstance(op, str) else None
    if decoder is None:
        raise InvalidRequest(f"unknown request {op!r}")
    return decoder(body)
