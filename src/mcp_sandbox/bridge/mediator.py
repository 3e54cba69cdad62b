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
import dataclasses
import json
import logging
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import anyio
import anyio.to_thread

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
from mcp_sandbox.config import Settings
from mcp_sandbox.errors import DownstreamError, ToolCallDenied, ValidationError
from mcp_sandbox.events import EventHub, ToolCalled
from mcp_sandbox.protocol import Call, Failure, Reply
from mcp_sandbox.sandbox.policy import TOOLS_MOUNT, Mount
from mcp_sandbox.state import StateLayout

# The SDK's types, the stub and typings generators and the search index are imported where a
# downstream server is used (see .clients): a run or a server without one never needs them.
if TYPE_CHECKING:
    import mcp_types as types

    from mcp_sandbox.bridge.search import ToolIndex
    from mcp_sandbox.bridge.stubs import ToolDoc

__all__ = ["Mediator", "RunAccess", "open_mediator"]

logger = logging.getLogger(__name__)


def _text_of(result: types.CallToolResult) -> str:
    import mcp_types as types

    texts = [block.text for block in result.content if isinstance(block, types.TextContent)]
    return "\n".join(texts) or "the tool reported an error without a message"


@dataclass
class _Stubs:
    tools: tuple[types.Tool, ...]
    docs: list[ToolDoc]
    directory: Path


class Mediator:
    """Downstream servers, their clients, stubs and search, for the server's lifetime."""

    def __init__(
        self, settings: Settings, discovery: Discovery, pool: ClientPool, events: EventHub | None = None
    ) -> None:
        self.settings = settings
        self.discovery = discovery
        self.pool = pool
        self.events = events if events is not None else EventHub()
        self._layout = StateLayout.of(settings)
        self._stubs: dict[str, _Stubs] = {}

    @property
    def servers(self) -> dict[str, ServerSpec]:
        """Every discovered server, by alias."""
        return dict(self.discovery.servers)

    def reload_policies(self, fresh: Discovery) -> list[str]:
        """Take the tool allow- and deny-lists of the servers in ``fresh`` (a new discovery); return what changed.

        Only the policies of servers already known change (their clients keep running, runs keep
        their sessions); a server added to or removed from the configuration needs a restart and
        is reported so.
        """
        notes: list[str] = []
        servers = dict(self.discovery.servers)
        for alias, spec in servers.items():
            new = fresh.servers.get(alias)
            if new is None:
                notes.append(f"{spec.name}: removed from the configuration; it stays until a restart")
                continue
            if (new.allow_tools, new.deny_tools) != (spec.allow_tools, spec.deny_tools):
                servers[alias] = dataclasses.replace(spec, allow_tools=new.allow_tools, deny_tools=new.deny_tools)
                self._stubs.pop(alias, None)  # regenerated with the new policy at the next run
                notes.append(f"{spec.name}: tool allow/deny lists reloaded")
        notes += [
            f"{new.name}: new in the configuration; it needs a restart"
            for a, new in fresh.servers.items()
            if a not in servers
        ]
        self.discovery = dataclasses.replace(self.discovery, servers=servers)
        return notes

    def known_tool(self, alias: str, name: str) -> str | None:
        """The listed tool of ``alias`` called ``name`` (or by its Python name), if its stubs are made."""
        stubs = self._stubs.get(alias)
        docs = stubs.docs if stubs is not None else []
        return next((doc.name for doc in docs if name in (doc.name, doc.python_name)), None)

    def resolve(self, name: str) -> ServerSpec | None:
        """The server called ``name`` (its alias or its configured name)."""
        return self.discovery.by_name(name)

    def aliases(self, names: Sequence[str], tenant: str | None = None) -> tuple[str, ...]:
        """The aliases of the servers called ``names`` (aliases or configured names), deduplicated.

        With ``tenant``, a server not open to that tenant is as unknown as one never configured.

        Raises:
            ValidationError: a name is not a configured server (argument ``servers``).
        """
        aliases: list[str] = []
        for name in names:
            spec = self.resolve(name)
            if spec is not None and tenant is not None and not spec.serves(tenant):
                spec = None
            if spec is None:
                known = (
                    ", ".join(spec.name for spec in self.servers.values() if tenant is None or spec.serves(tenant))
                    or "none are configured"
                )
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
        from mcp_sandbox.bridge.stubs import render_package, tool_docs
        from mcp_sandbox.bridge.typings import render_typings

        permitted = [tool for tool in tools if spec.permits(tool.name)]
        docs = tool_docs(alias, permitted)
        files = render_package(alias, spec.name, None, docs)
        files["index.d.ts"] = render_typings(alias, spec.name, None, docs)  # for TypeScript/JavaScript
        directory = await anyio.to_thread.run_sync(self._write, alias, files)
        stubs = _Stubs(tools, docs, directory)
        self._stubs[alias] = stubs
        return stubs

    def _write(self, alias: str, files: dict[str, str]) -> Path:
        from mcp_sandbox.bridge.stubs import write_tree

        return write_tree(self._layout.prepare_stubs(), files, prefix=alias)

    async def unavailable_stubs(self, spec: ServerSpec, reason: str) -> Path:
        """A stub package with no tools whose docstring says why the server is unavailable."""
        from mcp_sandbox.bridge.stubs import render_package
        from mcp_sandbox.bridge.typings import render_typings

        note = f"UNAVAILABLE in this run: {reason}"
        files = render_package(spec.alias, spec.name, note, [])
        files["index.d.ts"] = render_typings(spec.alias, spec.name, note, [])
        return await anyio.to_thread.run_sync(self._write, spec.alias, files)

    async def docs(self, alias: str) -> list[ToolDoc]:
        return (await self.stubs(alias)).docs

    async def index(self) -> tuple[ToolIndex, dict[str, str]]:
        """A search index over every server's tools, and the servers that could not be listed."""
        from mcp_sandbox.bridge.search import ToolIndex

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
        from mcp_sandbox.bridge.search import render

        index, failures = await self.index()
        return [(doc, render(doc, cast(Any, detail))) for doc, _ in index.search(query, limit=limit)], failures

    async def open_run(
        self, servers: Sequence[str], *, tenant: str | None = None, conversation: str | None = None
    ) -> RunAccess:
        """What a run of ``tenant`` that may call ``servers`` (aliases) sees: stubs bound under /tools, a gate.

        The run sees only the servers open to ``tenant`` (None: all), and calls a ``per_tenant``
        server's instance of that tenant.

        ``tenant`` and ``conversation`` (the workspace key) label the run's tool-call events.

        A server that cannot be started still gets a (toolless) stub package, whose docstring
        says why; calling it raises ``MCPError`` inside the sandbox.
        """
        allowed = {alias: self.servers[alias] for alias in servers}
        if not allowed:  # most runs: nothing to prepare
            return RunAccess(self, allowed, (), tenant=tenant, conversation=conversation)
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
        return RunAccess(self, allowed, tuple(mounts), tenant=tenant, conversation=conversation)


@dataclass
class RunAccess:
    """One run's gate to the downstream servers (implements the engine's ``ToolAccess``)."""

    bridge: Mediator
    allowed: dict[str, ServerSpec]
    mounts: tuple[Mount, ...]
    calls: int = 0
    result_bytes: int = 0
    tenant: str | None = None  # whose run: only the servers open to it exist for it
    conversation: str | None = None

    def _open(self, spec: ServerSpec) -> bool:
        return self.tenant is None or spec.serves(self.tenant)

    @property
    def servers(self) -> tuple[str, ...]:
        return tuple(self.allowed)

    async def handle(self, call: Call) -> Reply:
        """Answer one CALL frame from the sandbox. Never raises for what the sandbox sent."""
        started = time.perf_counter()
        request: Request | None = None
        size = 0
        try:
            request = decode_request(call.request)
            if isinstance(request, CallTool):
                answer, size = await self._call_tool(request)
                reply = Reply(call.id, answer)
            else:
                reply = Reply(call.id, await self._answer(request))
        except InvalidRequest as exc:
            reply = Reply(call.id, error=Failure("invalid", str(exc)))
        except ToolCallDenied as exc:
            reply = Reply(call.id, error=Failure("denied", exc.message, exc.server))
        except DownstreamError as exc:
            reply = Reply(call.id, error=Failure("unavailable", exc.message, exc.server))
        except _ToolFailed as exc:
            reply = Reply(call.id, error=Failure("tool", exc.message, exc.server))
        if isinstance(request, CallTool):
            self._emit(request, reply, time.perf_counter() - started, size)
        return reply

    def _emit(self, request: CallTool, reply: Reply, duration: float, size: int) -> None:
        spec = self.bridge.resolve(request.server)
        outcome = "ok" if reply.error is None else _OUTCOMES.get(reply.error.kind, reply.error.kind)
        self.bridge.events.emit(
            ToolCalled(
                tenant=self.tenant,
                conversation=self.conversation,
                # Only configured and listed names reach metrics and audit lines: a name the sandboxed
                # code made up (it could carry anything) is "unknown".
                server=spec.name if spec is not None else "unknown",
                tool=(self.bridge.known_tool(spec.alias, request.tool) if spec is not None else None) or "unknown",
                outcome=outcome,
                duration=duration,
                result_bytes=size,
            )
        )

    async def _answer(self, request: Request) -> Any:
        match request:
            case CallTool():
                return (await self._call_tool(request))[0]
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
        if spec is None or not self._open(spec):
            open_ones = sorted(alias for alias, spec in self.bridge.servers.items() if self._open(spec))
            known = ", ".join(open_ones) or "none are configured"
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

    async def _call_tool(self, request: CallTool) -> tuple[dict[str, Any], int]:
        """The tool's result for the sandbox, and its size in bytes."""
        spec = self._callable(request.server)
        docs = await self.bridge.docs(spec.alias)
        tool = next((doc.name for doc in docs if request.tool in (doc.name, doc.python_name)), request.tool)
        if not spec.permits(tool):
            raise ToolCallDenied(spec.name, f"the tool {tool!r} is not allowed by the operator's policy", tool)
        settings = self.bridge.settings
        self.calls += 1
        if self.calls > settings.max_tool_calls:
            raise ToolCallDenied(spec.name, f"this run reached its limit of {settings.max_tool_calls} tool calls", tool)
        result = await self.bridge.pool.call(spec.alias, tool, request.arguments, self.tenant)
        dumped = result.model_dump(mode="json", by_alias=True, exclude_none=True)
        size = len(json.dumps(dumped, ensure_ascii=False).encode("utf-8"))
        self.result_bytes += size
        if self.result_bytes > settings.max_tool_result_bytes:
            raise ToolCallDenied(
                spec.name,
                f"tool results of this run exceeded {settings.max_tool_result_bytes} bytes; the result was dropped",
                tool,
            )
        if request.raw:
            return dumped, size
        if result.is_error:
            raise _ToolFailed(spec.name, _text_of(result))
        return {"structuredContent": dumped.get("structuredContent"), "content": dumped.get("content", [])}, size

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
            if self._open(spec)
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
        hits = [(doc, text) for doc, text in hits if self._open(self.bridge.servers[doc.server])]
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
        from mcp_sandbox.bridge.search import render

        spec = self._server(request.server)
        docs = await self.bridge.docs(spec.alias)
        if request.tool is not None:
            docs = [doc for doc in docs if request.tool in (doc.name, doc.python_name)]
            if not docs:
                raise InvalidRequest(f"{spec.name!r} has no tool {request.tool!r}")
        return "\n\n".join(render(doc, request.detail) for doc in docs)


# A failed reply's kind, as the tool-call events name it.
_OUTCOMES = {"tool": "tool_error"}


class _ToolFailed(Exception):
    def __init__(self, server: str, message: str) -> None:
        super().__init__(message)
        self.server = server
        self.message = message


@contextlib.asynccontextmanager
async def open_mediator(
    settings: Settings, discovery: Discovery | None = None, events: EventHub | None = None
) -> AsyncIterator[Mediator]:
    """Discover the downstream servers (unless given) and keep their clients for this context."""
    if discovery is None:
        discovery = await anyio.to_thread.run_sync(discover, settings)
    async with open_client_pool(
        discovery.servers,
        connect_timeout=settings.connect_timeout,
        call_timeout=settings.tool_timeout,
        log_dir=StateLayout.of(settings).logs,
    ) as pool:
        yield Mediator(settings, discovery, pool, events)
