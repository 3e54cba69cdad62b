"""mcp-sandbox: an MCP server that runs untrusted code in an OS-level sandbox.

The public Python API is what ``__all__`` names; everything else is private.
"""

from __future__ import annotations

__version__ = "0.1.0"

from mcp_sandbox.config import Settings, load_settings
from mcp_sandbox.engine import Engine, ExecutionRequest, ExecutionResult
from mcp_sandbox.errors import (
    BackendUnavailableError,
    ChannelError,
    ConfigError,
    FrameError,
    SandboxError,
    SandboxStartError,
    ValidationError,
)

__all__ = [
    "BackendUnavailableError",
    "ChannelError",
    "ConfigError",
    "Engine",
    "ExecutionRequest",
    "ExecutionResult",
    "FrameError",
    "SandboxError",
    "SandboxStartError",
    "Settings",
    "ValidationError",
    "__version__",
    "load_settings",
]
