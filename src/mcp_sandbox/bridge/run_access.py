"""One run's gate to the downstream servers: the answers to its sandbox's requests, within its caps.

:meth:`Mediator.open_run <mcp_sandbox.bridge.mediator.Mediator.open_run>` opens a
:class:`RunAccess` per run (the engine's ``ToolAccess``). It decodes each CALL frame's request
(:mod:`.requests`) and answers it: only the run's servers can be called, only the tools their
policy permits, at most ``max_tool_calls`` calls and ``max_tool_result_bytes`` of results. Every
tool call is a ``ToolCalled`` event. Never raises for what the sandbox sent.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from mcp_sandbox import tracing
from mcp_sandbox.bridge.discovery import ServerSpec
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
from mcp_sandbox.errors import DownstreamError, ToolCallDenied
from mcp_sandbox.events import ToolCalled
from mcp_sandbox.protocol import Call, Failure, Reply
from mcp_sandbox.sandbox.policy import TOOLS_MOUNT, Mount

if TYPE_CHECKING:
    import mcp_types as types

    from mcp_sandbox.bridge.clients import ClientPool
    from mcp_sandbox.bridge.stubs import ToolDoc
    from mcp_sandbox.config import CodeModeSettings
    from mcp_sandbox.events import EventHub

__all__ = ["Downstream", "RunAccess", "Stubs"]


@dataclass
class Stubs:
    """A server's permitted tools as it sent them, their documentation, and the stub package's directory."""

    tools: tuple[types.Tool, ...]
    docs: list[ToolDoc]
    directory: Path


class Downstream(Protocol):
    """What a run's gate asks of the server-wide bridge (:class:`~.mediator.Mediator`)."""

    code_mode: CodeModeSettings
    pool: ClientPool
    events: EventHub

    @property
    def servers(self) -> dict[str, ServerSpec]: ...

    def resolve(self, name: str) -> ServerSpec | None: ...

    def known_tool(self, alias: str, name: str) -> str | None: ...

    async def docs(self, alias: str) -> list[ToolDoc]: ...

    async def stubs(self, alias: str) -> Stubs: ...

    async def search(self, query: str, detail: str, limit: int) -> tuple[list[tuple[ToolDoc, str]], dict[str, str]]: ...


def _text_of(result: types.CallToolResult) -> str:
    import mcp_types as types

    texts = [block.text for block in result.content if isinstance(block, types.TextContent)]
    return "\n".join(texts) or "the tool reported an error without a message"


@dataclass
class RunAccess:
    """One run's gate to the downstream servers (implements the engine's ``ToolAccess``)."""

    bridge: Downstream
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
                with tracing.span("code_mode tools/call", _CALL) as span:
                    try:
                        answer, size = await self._call_tool(request)
                    finally:
                        if span is not None:
                            span.set_attributes(_called(self.bridge, request, size))
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
        code_mode = self.bridge.code_mode
        self.calls += 1
        if self.calls > code_mode.max_tool_calls:
            raise ToolCallDenied(
                spec.name, f"this run reached its limit of {code_mode.max_tool_calls} tool calls", tool
            )
        result = await self.bridge.pool.call(spec.alias, tool, request.arguments, self.tenant)
        dumped = result.model_dump(mode="json", by_alias=True, exclude_none=True)
        size = len(json.dumps(dumped, ensure_ascii=False).encode("utf-8"))
        self.result_bytes += size
        if self.result_bytes > code_mode.max_tool_result_bytes:
            raise ToolCallDenied(
                spec.name,
                f"tool results of this run exceeded {code_mode.max_tool_result_bytes} bytes; the result was dropped",
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
            "tools": await self._list_tools(request.server, schemas=True),
        }

    async def _list_tools(self, server: str, *, schemas: bool = False) -> list[dict[str, Any]]:
        """The server's tools; with ``schemas``, each one's ``input_schema`` too (as the earlier bridge's had)."""
        spec = self._server(server)
        return [
            {
                "name": doc.name,
                "python_name": doc.python_name,
                "summary": doc.summary,
                # The earlier bridge's names for the same things.
                "alias": doc.python_name,
                "description": doc.description,
                **({"input_schema": dict(doc.input_schema)} if schemas else {}),
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


_CALL: dict[str, tracing.AttributeValue] = {"mcp.method.name": "tools/call", "gen_ai.operation.name": "execute_tool"}


def _called(bridge: Downstream, request: CallTool, size: int) -> dict[str, tracing.AttributeValue]:
    """A code-mode call's span attributes: only configured server names and listed tool names (a name the
    sandboxed code made up could carry anything: it is "unknown", as in the metrics and the audit log)."""
    spec = bridge.resolve(request.server)
    tool = bridge.known_tool(spec.alias, request.tool) if spec is not None else None
    return {
        "gen_ai.tool.name": tool or "unknown",
        "mcp_sandbox.server": spec.name if spec is not None else "unknown",
        "mcp_sandbox.tool.result_bytes": size,
    }
