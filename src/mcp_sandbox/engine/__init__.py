"""Executions: requests in, results out, on a sandbox backend; fresh or in a session."""

from mcp_sandbox.engine.engine import Engine
from mcp_sandbox.engine.result import (
    ExecutionRequest,
    ExecutionResult,
    Image,
    OutputListener,
    SessionState,
    Status,
    ToolAccess,
)

__all__ = [
    "Engine",
    "ExecutionRequest",
    "ExecutionResult",
    "Image",
    "OutputListener",
    "SessionState",
    "Status",
    "ToolAccess",
]
