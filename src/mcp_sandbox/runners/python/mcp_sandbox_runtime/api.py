"""Code mode inside the sandbox: call the tools of downstream MCP servers through the host.

Sandboxed code sees this as ``mcp.runtime`` (the generated stubs under ``/tools`` call it). Every
request goes to the host, which decides what this run may reach: the servers passed in
``run_python``'s ``servers`` argument, minus the tools an operator denied; a failed call raises
:class:`MCPError`. A tool's result is its ``structuredContent`` when it has one, else its content:
text (parsed when it is a JSON object or array) or :class:`Media` / :class:`Resource` /
:class:`ResourceLink` objects, one value for one block, a list for several; :func:`call_tool_raw`
gives the whole result as sent (so does every call when the server's ``tool_results`` is
``raw``). The earlier bridge's ``list_servers()``, ``list_tools(server)`` and
``query_tool_docs(...)`` answers are also awaitable in its shapes (:mod:`.dual`); its other
names are in :mod:`.compat`. A server may be named by its name, its alias, or a listed entry.
"""

from __future__ import annotations

import base64
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from .dual import DualList, DualStr
from .frames import Reply
from .host import HostUnavailable, connection

__all__ = [
    "MCPError",
    "Media",
    "Resource",
    "ResourceLink",
    "call_tool",
    "call_tool_raw",
    "call_tool_sync",
    "describe_server",
    "discovered_server_entries",
    "discovered_servers",
    "list_servers",
    "list_tools",
    "query_tool_docs",
    "search_tools",
]

Detail = Literal["name", "summary", "full"]
TOOL_RESULTS_VARIABLE = "MCP_SANDBOX_TOOL_RESULTS"  # the server's tool_results setting, "raw" or unset


class MCPError(RuntimeError):
    """A tool call or request failed (a ``RuntimeError``, as the earlier bridge's was).

    Attributes:
        server: the server asked (None for requests about no server in particular).
        tool: the tool called, if any.
        kind: ``tool`` (the tool reported an error), ``denied`` (this run may not make the call),
            ``unavailable`` (the server is down or did not answer), ``invalid`` (bad request).
        message: what went wrong.
    """

    def __init__(self, message: str, *, server: str | None = None, tool: str | None = None, kind: str = "tool"):
        where = ".".join(part for part in (server, tool) if part)
        super().__init__(f"{where}: {message}" if where else message)
        self.server = server
        self.tool = tool
        self.kind = kind
        self.message = message


def _save(path: str | os.PathLike[str], data: bytes) -> Path:
    target = Path(path)
    target.write_bytes(data)
    return target


@dataclass(frozen=True)
class Media:
    """An image or audio clip a tool returned. ``save(path)`` writes it to a file."""

    kind: str  # "image" or "audio"
    mime_type: str
    data: bytes

    def save(self, path: str | os.PathLike[str]) -> Path:
        return _save(path, self.data)

    def __repr__(self) -> str:
        return f"<{self.kind} {self.mime_type}, {len(self.data)} bytes>"


@dataclass(frozen=True)
class Resource:
    """A resource embedded in a tool result: ``text`` or ``blob``, as the server sent it."""

    uri: str
    mime_type: str | None
    text: str | None = None
    blob: bytes | None = None

    def save(self, path: str | os.PathLike[str]) -> Path:
        return _save(path, self.blob if self.blob is not None else (self.text or "").encode("utf-8"))


@dataclass(frozen=True)
class ResourceLink:
    """A link to a resource the server can serve (not its content)."""

    uri: str
    name: str
    description: str | None = None
    mime_type: str | None = None


def _text(text: str) -> Any:
    stripped = text.strip()
    if stripped[:1] in ("{", "["):
        try:
            return json.loads(stripped)
        except ValueError:
            pass
    return text


def _block(block: dict[str, Any]) -> Any:
    kind = block.get("type")
    if kind == "text":
        return _text(str(block.get("text", "")))
    if kind in ("image", "audio"):
        return Media(str(kind), str(block.get("mimeType", "")), base64.b64decode(block.get("data", ""), validate=True))
    if kind == "resource":
        inner = block.get("resource") or {}
        blob = inner.get("blob")
        return Resource(
            uri=str(inner.get("uri", "")),
            mime_type=inner.get("mimeType"),
            text=inner.get("text"),
            blob=base64.b64decode(blob, validate=True) if isinstance(blob, str) else None,
        )
    if kind == "resource_link":
        return ResourceLink(
            uri=str(block.get("uri", "")),
            name=str(block.get("name", "")),
            description=block.get("description"),
            mime_type=block.get("mimeType"),
        )
    return block


def _shape(result: dict[str, Any], raw: bool, server: str, tool: str) -> Any:
    try:
        return _shape_blocks(result, raw)
    except ValueError as error:  # e.g. image data that is not base64
        raise MCPError(
            f"the server sent a malformed result: {error}", server=server, tool=tool, kind="invalid"
        ) from None


def _shape_blocks(result: dict[str, Any], raw: bool) -> Any:
    blocks = [_block(block) for block in result.get("content") or () if isinstance(block, dict)]
    if raw:
        return {"structuredContent": result.get("structuredContent"), "content": blocks}
    if result.get("structuredContent") is not None:
        return result["structuredContent"]
    if not blocks:
        return None
    return blocks[0] if len(blocks) == 1 else blocks


def _unwrap(reply: Reply, server: str | None, tool: str | None) -> Any:
    if reply.error is None:
        return reply.result
    error = reply.error
    raise MCPError(error.message, server=error.server or server, tool=tool, kind=error.kind)


ServerRef = str | dict[str, Any]


def _name(server: ServerRef) -> str:
    """A server's name, alias, or an entry of list_servers()/discovered_server_entries() (its ``name``)."""
    if isinstance(server, dict) and isinstance(server.get("name"), str):
        return str(server["name"])
    return server if isinstance(server, str) else str(server)


def _request_sync(op: str, body: dict[str, Any], server: str | None = None, tool: str | None = None) -> Any:
    try:
        reply = connection().request(op, body).result()
    except HostUnavailable as error:
        raise MCPError(str(error), server=server, tool=tool, kind="unavailable") from None
    return _unwrap(reply, server, tool)


async def _request(op: str, body: dict[str, Any], server: str | None = None, tool: str | None = None) -> Any:
    import asyncio  # here, not at the top: it is costly to import and plain scripts never need it

    try:
        reply = await asyncio.wrap_future(connection().request(op, body))
    except HostUnavailable as error:
        raise MCPError(str(error), server=server, tool=tool, kind="unavailable") from None
    return _unwrap(reply, server, tool)


def _whole_results() -> bool:
    """Whether the operator asked for whole call results (setting ``tool_results = "raw"``)."""
    return os.environ.get(TOOL_RESULTS_VARIABLE) == "raw"


def _whole(result: dict[str, Any]) -> dict[str, Any]:
    result.setdefault("isError", False)
    return result


async def call_tool(server: str, tool: str, arguments: dict[str, Any] | None = None, *, raw: bool = False) -> Any:
    """Call ``tool`` of ``server`` (its alias or name) and return its result.

    With ``raw=True`` the result is ``{"structuredContent": ..., "content": [...]}``. When the
    server's ``tool_results`` setting is ``raw``, a call without ``raw=True`` returns what
    :func:`call_tool_raw` does (the earlier bridge's shape).

    Raises:
        MCPError: the tool failed, the server is unreachable, or this run may not call it.
    """
    if not raw and _whole_results():
        return await call_tool_raw(server, tool, arguments)
    server = _name(server)
    body = {"server": server, "tool": tool, "arguments": arguments or {}}
    return _shape(await _request("call_tool", body, server, tool), raw, server, tool)


async def call_tool_raw(server: str, tool: str, arguments: dict[str, Any] | None = None) -> dict[str, Any]:
    """The whole result of a tool call, as the server sent it (``content``, ``structuredContent``, ``isError``).

    A tool that reports an error returns its result with ``isError: true`` instead of raising.

    Raises:
        MCPError: the server is unreachable, or this run may not call it.
    """
    server = _name(server)
    body = {"server": server, "tool": tool, "arguments": arguments or {}, "raw": True}
    return _whole(await _request("call_tool", body, server, tool))


def call_tool_sync(server: str, tool: str, arguments: dict[str, Any] | None = None, *, raw: bool = False) -> Any:
    """Blocking form of :func:`call_tool`, for plain scripts."""
    server = _name(server)
    if not raw and _whole_results():
        body = {"server": server, "tool": tool, "arguments": arguments or {}, "raw": True}
        return _whole(_request_sync("call_tool", body, server, tool))
    body = {"server": server, "tool": tool, "arguments": arguments or {}}
    return _shape(_request_sync("call_tool", body, server, tool), raw, server, tool)


def list_servers() -> DualList:
    """The servers this run may call: ``[{"name", "alias", "tools"}]``.

    Awaited: their names, sorted, as a tuple (the earlier bridge's form).
    """
    listed: list[dict[str, Any]] = _request_sync("list_servers", {})

    async def names() -> tuple[str, ...]:
        return tuple(sorted(entry["name"] for entry in listed))

    return DualList(listed, names)


def discovered_servers(detailed: bool = False) -> tuple[str, ...] | tuple[dict[str, Any], ...]:
    """The names of every configured server, callable in this run or not (the earlier bridge's form).

    ``detailed=True`` gives ``({"name", "description"}, ...)``; :func:`discovered_server_entries`
    also says each one's alias and whether this run may call it.
    """
    result = discovered_server_entries()
    if detailed:
        return tuple({"name": entry["name"], "description": entry.get("description") or ""} for entry in result)
    return tuple(entry["name"] for entry in result)


def discovered_server_entries() -> list[dict[str, Any]]:
    """Every configured server, callable in this run or not: ``[{"name", "alias", "allowed"}]``."""
    result: list[dict[str, Any]] = _request_sync("discovered_servers", {})
    return result


def describe_server(name: ServerRef) -> dict[str, Any]:
    """A server's name, alias, transport, stub directory, ``cwd``, and its tools (summaries, ``input_schema``)."""
    server = _name(name)
    result: dict[str, Any] = _request_sync("describe_server", {"server": server}, server)
    return result


async def _definitions(server: str) -> list[dict[str, Any]]:
    listed: list[dict[str, Any]] = await _request("list_tools", {"server": server, "schemas": True}, server)
    return [{key: value for key, value in tool.items() if key != "python_name"} for tool in listed]


def list_tools(server: ServerRef, schemas: bool = False) -> DualList:
    """``server``'s tools: ``[{"name", "python_name", "summary", "alias", "description"}]``.

    With ``schemas=True``: each tool's definition as the server sent it (``inputSchema``, ...),
    plus its ``python_name``. Awaited: the definitions (the earlier bridge's form).
    """
    name = _name(server)
    listed: list[dict[str, Any]] = _request_sync("list_tools", {"server": name, "schemas": schemas}, name)
    return DualList(listed, lambda: _definitions(name))


def search_tools(query: str, detail: Detail = "summary", limit: int = 10) -> list[dict[str, Any]]:
    """Tools of every configured server ranked for ``query``: ``[{"server", "tool", "doc", ...}]``.

    ``detail`` chooses ``doc``: ``name``, ``summary`` (signature and first sentence) or
    ``full`` (the generated stub, with parameter and result types).
    """
    result: list[dict[str, Any]] = _request_sync("search_tools", {"query": query, "detail": detail, "limit": limit})
    return result


def bridge_doc(server: str, server_alias: str, tool: dict[str, Any], detail: str) -> dict[str, Any]:
    """One tool's documentation in the earlier bridge's shape."""
    doc = {"server": server, "serverAlias": server_alias, "tool": tool["name"], "toolAlias": tool["python_name"]}
    if tool.get("description"):
        doc["description"] = tool["description"]
    if detail == "full" and tool.get("inputSchema") is not None:
        doc["inputSchema"] = tool["inputSchema"]
    return doc


def select_tools(tools: list[dict[str, Any]], tool: str | None, server: str) -> list[dict[str, Any]]:
    """``tools`` whose name or Python name is ``tool`` (any case); all of them when ``tool`` is None.

    Raises:
        MCPError: no tool is called ``tool``.
    """
    if tool is None:
        return tools
    wanted = tool.lower()
    found = [entry for entry in tools if wanted in (entry["name"].lower(), entry["python_name"].lower())]
    if not found:
        raise MCPError(f"no tool {tool!r}", server=server, tool=tool, kind="invalid")
    return found


async def _bridge_docs(server: str, tool: str | None, detail: str) -> Any:
    described = await _request("describe_server", {"server": server}, server)
    tools = await _request("list_tools", {"server": server, "schemas": True}, server)
    docs = [
        bridge_doc(described["name"], described["alias"], entry, detail) for entry in select_tools(tools, tool, server)
    ]
    return docs[0] if tool is not None and len(docs) == 1 else docs


def query_tool_docs(server: ServerRef, tool: str | None = None, detail: Detail = "summary") -> DualStr:
    """The documentation of one tool, or of every tool of ``server``, as text.

    Awaited: ``[{"server", "serverAlias", "tool", "toolAlias", "description", "inputSchema"?}]``,
    or the one entry when ``tool`` is given (the earlier bridge's form).
    """
    name = _name(server)
    text: str = _request_sync("query_tool_docs", {"server": name, "tool": tool, "detail": detail}, name, tool)
    return DualStr(text, lambda: _bridge_docs(name, tool, detail))
