"""mcp-sandbox: an MCP server that runs untrusted code in an OS-level sandbox.

The public Python API is what ``__all__`` names; everything else is private.
"""

from __future__ import annotations

__version__ = "0.1.0"

from mcp_sandbox.config import Settings, load_settings
from mcp_sandbox.engine import Engine, ExecutionRequest, ExecutionResult
from mcp_sandbox.errors import (
    BackendUnavailableError,
    BusyError,
    ChannelError,
    ConfigError,
    DownstreamError,
    FrameError,
    QuotaExceededError,
    SandboxError,
    SandboxStartError,
    ToolCallDenied,
    ValidationError,
    WorkspaceError,
)

__all__ = [
    "BackendUnavailableError",
    "BusyError",
    "ChannelError",
    "ConfigError",
    "DownstreamError",
    "Engine",
    "ExecutionRequest",
    "ExecutionResult",
    "FrameError",
    "QuotaExceededError",
    "SandboxError",
    "SandboxStartError",
    "Settings",
    "ToolCallDenied",
    "ValidationError",
    "WorkspaceError",
    "__version__",
    "load_settings",
]
