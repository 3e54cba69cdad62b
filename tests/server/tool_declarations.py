"""The five tools as the server declares them, with a valid sample value for every argument."""

from __future__ import annotations

from typing import Any

import mcp_types as types

from mcp_sandbox.runners import LANGUAGES
from mcp_sandbox.server.tools.arguments import (
    CallContext,
    ListRunnersArguments,
    RunCodeArguments,
    RunPythonArguments,
    SearchToolsArguments,
    ToolArguments,
    UploadFileArguments,
)
from mcp_sandbox.server.tools.schemas import (
    list_runners_tool,
    run_code_tool,
    run_python_tool,
    search_tools_tool,
    upload_file_tool,
)

CONTEXT = CallContext(max_timeout=60.0, languages=LANGUAGES)

TOOLS: dict[str, tuple[types.Tool, type[ToolArguments]]] = {
    "run_python": (run_python_tool(CONTEXT, ["time"]), RunPythonArguments),
    "run_code": (run_code_tool(CONTEXT), RunCodeArguments),
    "upload_file": (upload_file_tool(CONTEXT), UploadFileArguments),
    "list_runners": (list_runners_tool(CONTEXT), ListRunnersArguments),
    "search_tools": (search_tools_tool(CONTEXT), SearchToolsArguments),
}

# A valid value for every argument any tool takes (a test fails when one is missing here).
SAMPLES: dict[str, Any] = {
    "code": "print(1)",
    "conversationId": "c-1",
    "reset": False,
    "forkFrom": "c-0",
    "checkpoint": "before-1",
    "servers": ["time", "time"],
    "timeout": 1.5,
    "outputMode": "json",
    "language": "typescript",
    "environment": [{"name": "GREETING", "value": "hello"}],
    "network": False,
    "filename": "in/data.csv",
    "content": "aGVsbG8=",
    "query": "current time",
    "detail": "full",
    "limit": 100,
}

# What an argument's sample needs beside it to be valid (a fork makes the conversation it names).
COMPANIONS: dict[str, dict[str, Any]] = {
    "forkFrom": {"conversationId": "c-1"},
    "checkpoint": {"conversationId": "c-1"},
}


def required(tool: str) -> dict[str, Any]:
    """The smallest valid call of ``tool``: its required arguments, from the samples."""
    schema = TOOLS[tool][0].input_schema
    return {name: SAMPLES[name] for name in schema.get("required", [])}
