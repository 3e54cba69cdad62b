"""mcp-sandbox: an MCP server that runs untrusted code in an OS-level sandbox.

The public Python API is what ``__all__`` names; everything else is private. The engine's names
are imported on first use: every ``mcp-sandbox`` command imports this package, and most need
no engine (bench/startup.py).
"""

from __future__ import annotations

__version__ = "0.1.0"

import typing

from mcp_sandbox.config import Settings, load_settings
from mcp_sandbox.errors import (
    BackendUnavailableError,
    BusyError,
    ChannelError,
    ConfigError,
    DiskFullError,
    DownstreamError,
    FrameError,
    LeaseLostError,
    QuotaExceededError,
    SandboxError,
    SandboxStartError,
    ToolCallDenied,
    UnavailableError,
    ValidationError,
    WorkspaceError,
)

if typing.TYPE_CHECKING:
    from mcp_sandbox.engine import Engine, ExecutionRequest, ExecutionResult

_ENGINE_NAMES = frozenset({"Engine", "ExecutionRequest", "ExecutionResult"})


def __getattr__(name: str) -> typing.Any:
    if name in _ENGINE_NAMES:
        import mcp_sandbox.engine

        return getattr(mcp_sandbox.engine, name)
    raise AttributeError(f"module 'mcp_sandbox' has no attribute {name!r}")


__all__ = [
    "BackendUnavailableError",
    "BusyError",
    "ChannelError",
    "ConfigError",
    "DiskFullError",
    "DownstreamError",
    "Engine",
    "ExecutionRequest",
    "ExecutionResult",
    "FrameError",
    "LeaseLostError",
    "QuotaExceededError",
    "SandboxError",
    "SandboxStartError",
    "Settings",
    "ToolCallDenied",
    "UnavailableError",
    "ValidationError",
    "WorkspaceError",
    "__version__",
    "load_settings",
]
