"""The MCP tools: their schemas, and the one place where errors become tool results."""

from __future__ import annotations

import logging
from collections.abc import Collection
from typing import Any

import mcp_types as types
from mcp.shared.exceptions import MCPError
from mcp_types import INVALID_PARAMS

from mcp_sandbox.config import OutputMode, Settings
from mcp_sandbox.engine import Engine, ExecutionRequest, ExecutionResult
from mcp_sandbox.errors import SandboxError, ValidationError
from mcp_sandbox.server.arguments import output_mode, parse_run_python
from mcp_sandbox.server.render import render

__all__ = ["OUTPUT_SCHEMA", "ToolHandlers"]

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


def _run_python_tool(settings: Settings) -> types.Tool:
    return types.Tool(
        name="run_python",
        description=(
            "Run Python 3 code in an isolated sandbox (no network, read-only root, writable "
            "/workspace and /tmp, limited memory/CPU/time) and return stdout, stderr and the exit "
            "status. Top-level await works. numpy, pandas, matplotlib and requests are installed. "
            "Each call starts from a fresh interpreter: print what you need to see."
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


def _tool_result(result: ExecutionResult, mode: OutputMode) -> types.CallToolResult:
    return types.CallToolResult(
        content=[types.TextContent(type="text", text=render(result, mode))],
        structured_content=result.structured(),
        is_error=result.status != "success",
    )


class ToolHandlers:
    """``tools/list`` and ``tools/call`` for the server."""

    def __init__(self, settings: Settings, engine: Engine, known_servers: Collection[str] = ()) -> None:
        self._settings = settings
        self._engine = engine
        self._known_servers = frozenset(known_servers)
        self._tools = [_run_python_tool(settings)]

    @property
    def tools(self) -> list[types.Tool]:
        return list(self._tools)

    async def list_tools(self, ctx: Any, params: types.PaginatedRequestParams | None) -> types.ListToolsResult:
        return types.ListToolsResult(tools=self.tools)

    async def call_tool(self, ctx: Any, params: types.CallToolRequestParams) -> types.CallToolResult:
        if params.name != "run_python":
            # A protocol error, as the spec has it: the model asked for a tool that is not listed.
            raise MCPError(INVALID_PARAMS, f"unknown tool {params.name!r} (available: run_python)")
        mode = output_mode(params.arguments, self._settings)
        try:
            arguments = parse_run_python(params.arguments, self._settings, self._known_servers)
            result = await self._engine.execute(ExecutionRequest(code=arguments.code, timeout=arguments.timeout))
        except ValidationError as exc:
            result = ExecutionResult.invalid(str(exc))
        except SandboxError as exc:
            logger.error("run_python failed in the sandbox layer: %s", exc)
            result = ExecutionResult(status="error", exit_code=None, error=f"sandbox failure: {exc}")
        return _tool_result(result, mode)
