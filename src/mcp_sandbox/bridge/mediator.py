"""The host side of code mode: what a run may reach, and the answers to its requests.

:class:`Mediator` lives as long as the server: the discovered servers, their client pool, the
generated stubs and the search index. For each run it opens a :class:`RunAccess` (the engine's
``ToolAccess``) that binds the stubs of the run's servers under ``/tools`` and answers the
sandbox's requests. The host decides, whatever the sandbox sends: only the run's servers can be
called, only the tools their policy permits, at most ``max_tool_calls`` calls and
``max_tool_result_bytes`` of results per run. Downstream credentials (env, headers) never leave
the host: the sandbox sees names, schemas and results.
"""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import anyio
import anyio.to_thread
import mcp_types as types

from mcp_sandbox.bridge.clients import ClientPool, open_client_pool
from mcp_sandbox.bridge.discovery import Discovery, ServerSpec, discover
from mcp_sandbox.bridge.requests import (
    CallTool,
    DescribeServer,
    DiscoveredServers,
    InvalidRequest,
    ListServers,
    ListTools,
    QueryToolDocs,
    Request,
    SearchTools,
    decode_request,
)
from mcp_sandbox.bridge.search import ToolIndex, render
from mcp_sandbox.bridge.stubs import ToolDoc, render_package, tool_docs, write_tree
from mcp_sandbox.bridge.typings import render_typings
from mcp_sandbox.config import Settings
from mcp_sandbox.errors import DownstreamError, ToolCallDenied, ValidationError
from mcp_sandbox.runners.python.mcp_sandbox_runtime.frames import Call, Failure, Reply
from mcp_sandbox.sandbox.policy import TOOLS_MOUNT, Mount
from mcp_sandbox.state import StateLayout

__all__ = ["Mediator", "RunAccess", "open_mediator"]

logger = logging.getLogger(__name__)


def _text_of(result: types.CallToolResult) -> str:
    texts = [block.text for block in result.content if isinstance(block, types.TextContent)]
    return "\n".join(texts) or "the tool reported an error without a message"


@dataclass
class _Stubs:
    tools: tuple[types.Tool, ...]
    docs: list[ToolDoc]
    directory: Path


class Mediator:
    """Downstream servers, their clients, stubs and search, for the server's lifetime."""

    def __init__(self, settings: Settings, discovery: Discovery, pool: ClientPool) -> None:
        self.settings = settings
        self.discovery = discovery
        self.pool = pool
        self._layout = StateLayout.of(settings)
        self._stubs: dict[str, _Stubs] = {}

    @property
    def servers(self) -> dict[str, ServerSpec]:
        """Every discovered server, by alias."""
        return dict(self.discovery.servers)

    def resolve(self, name: str) -> ServerSpec | None:
        """The server called ``name`` (its alias or its configured name)."""
        return self.discovery.by_name(name)

    def aliases(self, names: Sequence[str]) -> tuple[str, ...]:
        """The aliases of the servers called ``names`` (aliases or configured names), deduplicated.

        Raises:
            ValidationError: a name is not a configured server (argument ``servers``).
        """
        aliases: list[str] = []
        for name in names:
            spec = self.resolve(name)
            if spec is None:
                known = ", ".join(spec.name for spec in self.servers.values()) or "none are configured"
                raise ValidationError("servers", f"unknown server {name!r} (available: {known})")
            aliases.append(spec.alias)
        return tuple(dict.fromkeys(aliases))

    async def stubs(self, alias: str) -> _Stubs:
        """The docs and the stub directory of ``alias``, regenerated when its tool list changes.

        Raises:
            DownstreamError: the server could not be started.
        """
        spec = self.servers[alias]
        tools = await self.pool.tools(alias)
        cached = self._stubs.get(alias)
        if cached is not None and cached.tools is tools:
            return cached
        permitted = [tool for tool in tools if spec.permits(tool.name)]
        docs = tool_docs(alias, permitted)
        files = render_package(alias, spec.name, None, docs)
        files["index.d.ts"] = render_typings(alias, spec.name, None, docs)  # for TypeScript/JavaScript
        directory = await anyio.to_thread.run_sync(self._write, alias, files)
        stubs = _Stubs(tools, docs, directory)
        self._stubs[alias] = stubs
        return stubs

    def _write(self, alias: str, files: dict[str, str]) -> Path:
        return write_tree(self._layout.prepare_stubs(), files, prefix=alias)

    async def unavailable_stubs(self, spec: ServerSpec, reason: str) -> Path:
        """A stub package with no tools whose docstring says why the server is unavailable."""
        note = f"UNAVAILABLE in this run: {reason}"
        files = render_package(spec.alias, spec.name, note, [])
        files["index.d.ts"] = render_typings(spec.alias, spec.name, note, [])
        return await anyio.to_thread.run_sync(self._write, spec.alias, files)

    async def docs(self, alias: str) -> list[ToolDoc]:
        return (await self.stubs(alias)).docs

    async def index(self) -> tuple[ToolIndex, dict[str, str]]:
        """A search index over every server's tools, and the servers that could not be listed."""
        docs: list[ToolDoc] = []
        failures: dict[str, str] = {}
        listed = await self.pool.all_tools()
        for alias, tools in listed.items():
            if isinstance(tools, DownstreamError):
                failures[self.servers[alias].name] = tools.message
                continue
            docs.extend((await self.stubs(alias)).docs)
        return ToolIndex(docs), failures

    async def search(self, query: str, detail: str, limit: int) -> tuple[list[tuple[ToolDoc, str]], dict[str, str]]:
        """The best ``limit`` tools for ``query``, each rendered at ``detail``; and the failures."""
        index, failures = await self.index()
        return [(doc, render(doc, cast(Any, detail))) for doc, _ in index.search(query, limit=limit)], failures

    async def open_run(self, servers: Sequence[str]) -> RunAccess:
        """What a run that may call ``servers`` (aliases) sees: stubs bound under /tools, a gate.

        A server that cannot be started still gets a (toolless) stub package, whose docstring
        says why; calling it raises ``MCPError`` inside the sandbox.
        """
        allowed = {alias: self.servers[alias] for alias in servers}
        directories: dict[str, Path] = {}

        async def prepare(spec: ServerSpec) -> None:
            try:
                directories[spec.alias] = (await self.stubs(spec.alias)).directory
            except DownstreamError as exc:
                directories[spec.alias] = await self.unavailable_stubs(spec, exc.message)

        async with anyio.create_task_group() as group:  # servers start concurrently
            for spec in allowed.values():
                group.start_soon(prepare, spec)
        mounts = [Mount(directories[alias], f"{TOOLS_MOUNT}/{alias}") for alias in allowed]
        return RunAccess(self, allowed, tuple(mounts))


@dataclass
class RunAccess:
    """One run's gate to the downstream servers (implements the engine's ``ToolAccess``)."""

    bridge: Mediator
    allowed: dict[str, ServerSpec]
    mounts: tuple[Mount, ...]
    calls: int = 0
    result_bytes: int = 0

    @property
    def servers(self) -> tuple[str, ...]:
        return tuple(self.allowed)

    async def handle(self, call: Call) -> Reply:
        """Answer one CALL frame from the sandbox. Never raises for what the sandbox sent."""
        try:
            request = decode_request(call.request)
            return Reply(call.id, await self._answer(request))
        except InvalidRequest as exc:
            return Reply(call.id, error=Failure("invalid", str(exc)))
        except ToolCallDenied as exc:
            return Reply(call.id, error=Failure("denied", exc.message, exc.server))
        except DownstreamError as exc:
            return Reply(call.id, error=Failure("unavailable", exc.message, exc.server))
        except _ToolFailed as exc:
            return Reply(call.id, error=Failure("tool", exc.message, exc.server))

    async def _answer(self, request: Request) -> Any:
        match request:
            case CallTool():
                return await self._call_tool(request)
            case ListServers():
                return await self._list_servers()
            case DiscoveredServers():
                return self._discovered_servers()
            case DescribeServer():
                return await self._describe_server(request)
            case ListTools() if request.schemas:
                return await self._tool_definitions(request.server)
            case ListTools():
                return await self._list_tools(request.server)
            case SearchTools():
                return await self._search_tools(request)
            case QueryToolDocs():
                return await self._query_tool_docs(request)

    # --- requests ---------------------------------------------------------------------------

    def _server(self, name: str) -> ServerSpec:
        spec = self.bridge.resolve(name)
        if spec is None:
            known = ", ".join(sorted(self.bridge.servers)) or "none are configured"
            raise ToolCallDenied(name, f"there is no server {name!r} (configured: {known})")
        return spec

    def _callable(self, name: str) -> ServerSpec:
        spec = self._server(name)
        if spec.alias not in self.allowed:
            allowed = ", ".join(self.allowed) or "none"
            raise ToolCallDenied(
                spec.name,
                f"this run may not call {spec.name!r} (allowed: {allowed}); pass it in run_python's `servers` argument",
            )
        return spec

    async def _call_tool(self, request: CallTool) -> dict[str, Any]:
        spec = self._callable(request.server)
        docs = await self.bridge.docs(spec.alias)
        tool = next((doc.name for doc in docs if request.tool in (doc.name, doc.python_name)), request.tool)
        if not spec.permits(tool):
            raise ToolCallDenied(spec.name, f"the tool {tool!r} is not allowed by the operator's policy", tool)
        settings = self.bridge.settings
        self.calls += 1
        if self.calls > settings.max_tool_calls:
            raise ToolCallDenied(spec.name, f"this run reached its limit of {settings.max_tool_calls} tool calls", tool)
        result = await self.bridge.pool.call(spec.alias, tool, request.arguments)
        dumped = result.model_dump(mode="json", by_alias=True, exclude_none=True)
        self.result_bytes += len(json.dumps(dumped, ensure_ascii=False).encode("utf-8"))
        if self.result_bytes > settings.max_tool_result_bytes:
            raise ToolCallDenied(
                spec.name,
                f"tool results of this run exceeded {settings.max_tool_result_bytes} bytes; the result was dropped",
                tool,
            )
        if request.raw:
            return dumped
        if result.is_error:
            raise _ToolFailed(spec.name, _text_of(result))
        return {"structuredContent": dumped.get("structuredContent"), "content": dumped.get("content", [])}

    async def _list_servers(self) -> list[dict[str, Any]]:
        listed = []
        for alias, spec in self.allowed.items():
            try:
                count: int | None = len(await self.bridge.docs(alias))
            except DownstreamError:
                count = None
            listed.append({"name": spec.name, "alias": alias, "tools": count})
        return listed

    def _discovered_servers(self) -> list[dict[str, Any]]:
        return [
            {"name": spec.name, "alias": alias, "allowed": alias in self.allowed}
            for alias, spec in self.bridge.servers.items()
        ]

    async def _describe_server(self, request: DescribeServer) -> dict[str, Any]:
        spec = self._server(request.server)
        return {
            "name": spec.name,
            "alias": spec.alias,
            "transport": spec.transport,
            "allowed": spec.alias in self.allowed,
            "stubs": f"{TOOLS_MOUNT}/{spec.alias}" if spec.alias in self.allowed else None,
            "cwd": str(spec.cwd) if spec.cwd is not None else None,
            "tools": await self._list_tools(request.server),
        }

    async def _list_tools(self, server: str) -> list[dict[str, Any]]:
        spec = self._server(server)
        return [
            {
                "name": doc.name,
                "python_name": doc.python_name,
                "summary": doc.summary,
                # The earlier bridge's names for the same things.
                "alias": doc.python_name,
                "description": doc.description,
            }
            for doc in await self.bridge.docs(spec.alias)
        ]

    async def _tool_definitions(self, server: str) -> list[dict[str, Any]]:
        """The permitted tools' definitions as the server sent them, each with its ``python_name``."""
        spec = self._server(server)
        stubs = await self.bridge.stubs(spec.alias)
        names = {doc.name: doc.python_name for doc in stubs.docs}
        return [
            {**tool.model_dump(mode="json", by_alias=True, exclude_none=True), "python_name": names[tool.name]}
            for tool in stubs.tools
            if tool.name in names
        ]

    async def _search_tools(self, request: SearchTools) -> list[dict[str, Any]]:
        hits, _ = await self.bridge.search(request.query, request.detail, request.limit)
        return [
            {
                "server": self.bridge.servers[doc.server].name,
                "tool": doc.name,
                "python_name": doc.python_name,
                "doc": text,
                "server_alias": doc.server,
                "description": doc.description,
                **({"inputSchema": dict(doc.input_schema)} if request.detail == "full" else {}),
            }
            for doc, text in hits
        ]

    async def _query_tool_docs(self, request: QueryToolDocs) -> str:
        spec = self._server(request.server)
        docs = await self.bridge.docs(spec.alias)
        if request.tool is not None:
            docs = [doc for doc in docs if request.tool in (doc.name, doc.python_name)]
            if not docs:
                raise InvalidRequest(f"{spec.name!r} has no tool {request.tool!r}")
        return "\n\n".join(render(doc, request.detail) for doc in docs)


class _ToolFailed(Exception):
    def __init__(self, server: str, message: str) -> None:
        super().__init__(message)
        self.server = server
        self.message = message


@contextlib.asynccontextmanager
async def open_mediator(settings: Settings, discovery: Discovery | None = None) -> AsyncIterator[Mediator]:
    """Discover the downstream servers (unless given) and keep their clients for this context."""
    if discovery is None:
        discovery = await anyio.to_thread.run_sync(discover, settings)
    async with open_client_pool(
        discovery.servers,
        connect_timeout=settings.connect_timeout,
        call_timeout=settings.tool_timeout,
        log_dir=StateLayout.of(settings).logs,
    ) as pool:
        yield Mediator(settings, discovery, pool)
