"""The MCP tools' definitions: names, descriptions, input and output schemas.

Everything here is sent in every ``tools/list`` answer, which must stay under 1,000 tokens
however many downstream servers exist: descriptions are terse, and the server list is capped.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import mcp_types as types

from mcp_sandbox.bridge.search import DETAILS
from mcp_sandbox.config import OUTPUT_MODES, Settings

__all__ = [
    "RUN_OUTPUT_SCHEMA",
    "list_runners_tool",
    "run_code_tool",
    "run_python_tool",
    "search_tools_tool",
    "upload_file_tool",
]

# Every key here is paid for in tokens in every tools/list: the shape, not a manual.

RUN_OUTPUT_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "status": {"type": "string", "enum": ["success", "error", "timeout", "validation_error"]},
        "exitCode": {"type": ["integer", "null"]},
        "stdout": {"type": "string"},
        "stderr": {"type": "string"},
        "durationMs": {"type": "integer"},
        "truncated": {"type": "boolean"},
        "error": {"type": "string"},
        "session": {"type": "string"},
        "files": {"type": "array"},
    },
    "required": ["status", "exitCode", "stdout", "stderr", "durationMs", "truncated"],
}

# The description names servers by alias (ASCII identifiers, what code writes after `mcp_`),
# within a character budget, so that tools/list stays under 1,000 tokens however many servers
# are configured and whatever their names.
_NAMES_BUDGET = 48
_MAX_NAME = 20


def _servers_line(aliases: Sequence[str]) -> str:
    if not aliases:
        return ""
    shown: list[str] = []
    used = 0
    for alias in aliases:
        if len(alias) > _MAX_NAME:
            continue  # a cut name could not be called; the model finds it with search_tools
        if used + len(alias) > _NAMES_BUDGET:
            break
        shown.append(alias)
        used += len(alias) + 2
    hidden = len(aliases) - len(shown)
    listed = ", ".join(shown) + (f" and {hidden} more" if shown and hidden else "") if shown else f"({hidden})"
    return (
        f" Code mode: code can call MCP servers {listed}: list them in `servers`, then "
        "`await mcp_<server>.<tool>(...)` (or `<tool>_sync`); errors raise mcp.runtime.MCPError; typed stubs "
        "in /tools/<server>/; see search_tools."
    )


def _common_properties(settings: Settings) -> dict[str, Any]:
    return {
        "code": {"type": "string"},
        "conversationId": {"type": "string", "description": "Keeps files and variables between runs"},
        "reset": {"type": "boolean", "description": "Fresh interpreter"},
        "servers": {"type": "array", "items": {"type": "string"}},
        "timeout": {"type": "number", "description": f"Seconds, max {settings.max_timeout:g}"},
        "outputMode": {"type": "string", "enum": list(OUTPUT_MODES)},
    }


def run_python_tool(settings: Settings, servers: Sequence[str]) -> types.Tool:
    return types.Tool(
        name="run_python",
        description=(
            "Run Python 3 in an isolated sandbox (no network, read-only root, writable /workspace, limited "
            "memory/CPU/time); returns stdout, stderr, exit status. Top-level await works; numpy, pandas, "
            "matplotlib installed; plots come back as images." + _servers_line(servers)
        ),
        input_schema={"type": "object", "properties": _common_properties(settings), "required": ["code"]},
        output_schema=RUN_OUTPUT_SCHEMA,
        annotations=types.ToolAnnotations(destructive_hint=False, open_world_hint=False),
    )


def run_code_tool(settings: Settings, languages: Sequence[str]) -> types.Tool:
    # The arguments run_python describes, undescribed here; plus language, environment, network.
    properties = {name: {"type": schema["type"]} for name, schema in _common_properties(settings).items()}
    properties["servers"] = {"type": "array", "items": {"type": "string"}}
    properties["outputMode"] = {"type": "string", "enum": list(OUTPUT_MODES)}
    properties["language"] = {"enum": list(languages)}  # strings all: "type" would only cost tokens
    properties["environment"] = {"type": "object", "additionalProperties": {"type": "string"}}
    properties["network"] = {"type": "boolean"}
    return types.Tool(
        name="run_code",
        description=("Like run_python (same sandbox, arguments and result), in any language list_runners reports."),
        # No outputSchema: the result is run_python's, whose schema is listed once to save tokens.
        input_schema={"type": "object", "properties": properties, "required": ["code", "language"]},
        annotations=types.ToolAnnotations(destructive_hint=False, open_world_hint=False),
    )


def upload_file_tool() -> types.Tool:
    return types.Tool(
        name="upload_file",
        description="Store a file in a conversation's /workspace for later runs.",
        input_schema={
            "type": "object",
            "properties": {
                "conversationId": {"type": "string"},
                "filename": {"type": "string", "description": "Relative path"},
                "content": {"type": "string", "description": "Base64"},
            },
            "required": ["conversationId", "filename", "content"],
        },
        annotations=types.ToolAnnotations(destructive_hint=False, open_world_hint=False),
    )


def list_runners_tool() -> types.Tool:
    return types.Tool(
        name="list_runners",
        description="The languages run_code accepts, with runtime versions and installed packages.",
        input_schema={"type": "object", "properties": {}},
        annotations=types.ToolAnnotations(read_only_hint=True, open_world_hint=False),
    )


def search_tools_tool() -> types.Tool:
    return types.Tool(
        name="search_tools",
        description="Search the tools sandboxed code can call; detail full gives the typed stub.",
        input_schema={
            "type": "object",
            "properties": {
                "query": {"type": "string"},
                "detail": {"type": "string", "enum": list(DETAILS)},
                "limit": {"type": "integer", "minimum": 1, "maximum": 50},
            },
            "required": ["query"],
        },
        # No outputSchema: {"results": [{server, tool, doc}]} is not worth its tokens in every tools/list.
        annotations=types.ToolAnnotations(read_only_hint=True, open_world_hint=False),
    )
