"""The MCP tools: their schemas, and the one place where errors become tool results."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import mcp_types as types
from mcp.shared.exceptions import MCPError
from mcp_types import INVALID_PARAMS

from mcp_sandbox.bridge.mediator import Bridge
from mcp_sandbox.bridge.search import DETAILS
from mcp_sandbox.config import OutputMode, Settings
from mcp_sandbox.engine import Engine, ExecutionRequest, ExecutionResult
from mcp_sandbox.errors import SandboxError, ValidationError
from mcp_sandbox.server.arguments import output_mode, parse_run_python, parse_search_tools
from mcp_sandbox.server.render import render

__all__ = ["OUTPUT_SCHEMA", "SEARCH_OUTPUT_SCHEMA", "ToolHandlers"]

logger = logging.getLogger(__name__)

OUTPUT_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "status": {"type": "string", "enum": ["success", "error", "timeout", "validation_error"]},
        "exitCode": {"type": ["integer", "null"]},
        "stdout": {"type": "string"},
        "stderr": {"type": "string"},
        "durationMs": {"type": "integer"},
        "truncated": {"type": "boolean"},
        "error": {"type": "string"},
    },
    "required": ["status", "exitCode", "stdout", "stderr", "durationMs", "truncated"],
}


# The description names at most this many servers (and each in at most _MAX_NAME characters),
# so that tools/list stays small however many servers are configured.
_LISTED_SERVERS = 12
_MAX_NAME = 32


def _servers_line(names: Sequence[str]) -> str:
    if not names:
        return "No MCP servers are configured for code mode."
    shown = [name if len(name) <= _MAX_NAME else name[: _MAX_NAME - 1] + "…" for name in names[:_LISTED_SERVERS]]
    more = f" and {len(names) - _LISTED_SERVERS} more" if len(names) > _LISTED_SERVERS else ""
    return (
        f"Code mode: the code can call the tools of these MCP servers: {', '.join(shown)}{more}. "
        "Pass the ones a run needs in `servers`, then `await mcp_<server>.<tool>(...)` (or `<tool>_sync(...)`); "
        "a failing call raises mcp.runtime.MCPError. Typed stubs are in /tools/<server>/<tool>.py; "
        "find tools with search_tools or, in code, mcp.runtime.search_tools(query)."
    )


def _run_python_tool(settings: Settings, servers: Sequence[str]) -> types.Tool:
    return types.Tool(
        name="run_python",
        description=(
            "Run Python 3 code in an isolated sandbox (no network, read-only root, writable "
            "/workspace and /tmp, limited memory/CPU/time) and return stdout, stderr and the exit "
            "status. Top-level await works. numpy, pandas, matplotlib and requests are installed. "
            "Each call starts from a fresh interpreter: print what you need to see. " + _servers_line(servers)
        ),
        input_schema={
            "type": "object",
            "properties": {
                "code": {"type": "string", "description": "Python source to run as __main__."},
                "servers": {
                    "type": "array",
                    "items": {"type": "string"},
                    "description": "Downstream MCP servers this run may call.",
                },
                "timeout": {
                    "type": "number",
                    "description": f"Seconds (default {settings.timeout:g}, max {settings.max_timeout:g}).",
                },
                "outputMode": {"type": "string", "enum": ["compact", "json", "toon"]},
            },
            "required": ["code"],
        },
        output_schema=OUTPUT_SCHEMA,
        annotations=types.ToolAnnotations(
            title="Run Python in a sandbox", read_only_hint=False, destructive_hint=False, open_world_hint=False
        ),
    )


SEARCH_OUTPUT_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "results": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {"server": {"type": "string"}, "tool": {"type": "string"}, "doc": {"type": "string"}},
                "required": ["server", "tool", "doc"],
            },
        },
        "unavailable": {"type": "object", "additionalProperties": {"type": "string"}},
    },
    "required": ["results"],
}


def _search_tools_tool() -> types.Tool:
    return types.Tool(
        name="search_tools",
        description=(
            "Search the tools of the MCP servers that run_python code can call. Returns the best matches; "
            "detail: name, summary (signature and first sentence, default) or full (the typed Python stub)."
        ),
        input_schema={
            "type": "object",
            "properties": {
                "query": {"type": "string", "description": "What the tool should do, in a few words."},
                "detail": {"type": "string", "enum": list(DETAILS)},
                "limit": {"type": "integer", "minimum": 1, "maximum": 50},
            },
            "required": ["query"],
        },
        output_schema=SEARCH_OUTPUT_SCHEMA,
        annotations=types.ToolAnnotations(title="Search downstream tools", read_only_hint=True, open_world_hint=False),
    )


def _tool_result(result: ExecutionResult, mode: OutputMode) -> types.CallToolResult:
    return types.CallToolResult(
        content=[types.TextContent(type="text", text=render(result, mode))],
        structured_content=result.structured(),
        is_error=result.status != "success",
    )


class ToolHandlers:
    """``tools/list`` and ``tools/call`` for the server."""

    def __init__(self, settings: Settings, engine: Engine, bridge: Bridge | None = None) -> None:
        self._settings = settings
        self._engine = engine
        self._bridge = bridge
        names = [spec.name for spec in bridge.servers.values()] if bridge is not None else []
        self._tools = [_run_python_tool(settings, names)]
        if bridge is not None and bridge.servers:
            self._tools.append(_search_tools_tool())

    @property
    def tools(self) -> list[types.Tool]:
        return list(self._tools)

    async def list_tools(self, ctx: Any, params: types.PaginatedRequestParams | None) -> types.ListToolsResult:
        return types.ListToolsResult(tools=self.tools)

    async def call_tool(self, ctx: Any, params: types.CallToolRequestParams) -> types.CallToolResult:
        if params.name == "run_python":
            return await self._run_python(params.arguments)
        if params.name == "search_tools" and len(self._tools) > 1:
            return await self._search_tools(params.arguments)
        # A protocol error, as the spec has it: the model asked for a tool that is not listed.
        available = ", ".join(tool.name for tool in self._tools)
        raise MCPError(INVALID_PARAMS, f"unknown tool {params.name!r} (available: {available})")

    async def _run_python(self, raw: dict[str, Any] | None) -> types.CallToolResult:
        mode = output_mode(raw, self._settings)
        try:
            arguments = parse_run_python(raw, self._settings)
            tools = None
            if self._bridge is not None:
                tools = await self._bridge.open_run(self._bridge.aliases(arguments.servers))
            elif arguments.servers:
                raise ValidationError("servers", f"unknown server {arguments.servers[0]!r} (none are configured)")
            request = ExecutionRequest(code=arguments.code, timeout=arguments.timeout, tools=tools)
            result = await self._engine.execute(request)
        except ValidationError as exc:
            result = ExecutionResult.invalid(str(exc))
        except SandboxError as exc:
            logger.error("run_python failed in the sandbox layer: %s", exc)
            result = ExecutionResult(status="error", exit_code=None, error=f"sandbox failure: {exc}")
        return _tool_result(result, mode)

    async def _search_tools(self, raw: dict[str, Any] | None) -> types.CallToolResult:
        assert self._bridge is not None
        try:
            query, detail, limit = parse_search_tools(raw)
        except ValidationError as exc:
            return types.CallToolResult(content=[types.TextContent(type="text", text=str(exc))], is_error=True)
        hits, unavailable = await self._bridge.search(query, detail, limit)
        servers = self._bridge.servers
        results = [{"server": servers[doc.server].name, "tool": doc.name, "doc": text} for doc, text in hits]
        lines = [hit["doc"] for hit in results] or [f"no tool matches {query!r}"]
        lines.extend(f"(server {name} is unavailable: {reason})" for name, reason in unavailable.items())
        structured: dict[str, Any] = {"results": results}
        if unavailable:
            structured["unavailable"] = unavailable
        separator = "\n\n" if detail == "full" else "\n"
        return types.CallToolResult(
            content=[types.TextContent(type="text", text=separator.join(lines))], structured_content=structured
        )
