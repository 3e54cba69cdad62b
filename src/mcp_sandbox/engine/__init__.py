"""Executions: requests in, results out, on a sandbox backend."""

from mcp_sandbox.engine.executor import Engine
from mcp_sandbox.engine.result import ExecutionRequest, ExecutionResult, Status, ToolAccess

__all__ = ["Engine", "ExecutionRequest", "ExecutionResult", "Status", "ToolAccess"]
