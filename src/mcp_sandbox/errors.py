"""The one exception tree of mcp-sandbox.

::

    SandboxError                  base of everything this package raises on purpose
    ├── ConfigError               a setting is malformed or contradictory
    ├── ValidationError           a request argument is wrong (names the argument)
    ├── BackendUnavailableError   a sandbox backend cannot run on this host, or cannot
    │                             enforce the policy asked of it
    ├── SandboxStartError         a sandbox failed to start (bwrap refused, runtime missing)
    ├── ChannelError              the host <-> sandbox channel broke its protocol
    │   └── FrameError            a malformed, oversized, unknown or wrong-version frame
    │                             (mcp_sandbox.protocol translates the runtime's own into it)
    ├── DownstreamError           a downstream MCP server cannot be reached, or refused a call
    │   └── ToolCallDenied        the policy forbids a tool call (server not allowed, tool denied, cap)
    ├── WorkspaceError            a conversation's files cannot be stored or read as asked
    │   ├── QuotaExceededError    the write would take a conversation past its byte or file quota
    │   ├── DiskFullError         the server's disk (the state directory's filesystem) is full
    │   ├── DamagedIndex          (replicas/packs.py) the object store's index of packed files
    │   │                         cannot be used: the owner's next write-back rebuilds it
    │   ├── LeaseLostError        this replica lost the conversation's lease: retry (another runs it)
    │   └── UnavailableError      the metadata database or the object store cannot be reached:
    │                             retry (HTTP 503 with Retry-After; a tool's error result saying so)
    └── BusyError                 the server is at capacity (sessions, queue); try again later

Foreign errors (``OSError`` from process spawning, ``json`` errors from frames, ...)
are translated at the boundary with ``raise ... from exc``. Exactly one place,
``mcp_sandbox.server.tools``, turns these errors into tool results. The storage clients
(``workspace.postgres_db``, ``replicas.objects``) translate a connection that cannot be made or
a service that answers it is down into :class:`UnavailableError`, which the HTTP routes answer
with 503 once (``server.routes.outages``): never 404 (no such file) nor 409 (do not retry).
"""

from __future__ import annotations

__all__ = [
    "BackendUnavailableError",
    "BusyError",
    "ChannelError",
    "ConfigError",
    "DiskFullError",
    "DownstreamError",
    "FrameError",
    "LeaseLostError",
    "QuotaExceededError",
    "SandboxError",
    "SandboxStartError",
    "ToolCallDenied",
    "UnavailableError",
    "ValidationError",
    "WorkspaceError",
]


class SandboxError(Exception):
    """Base class of every error mcp-sandbox raises on purpose."""


class ConfigError(SandboxError):
    """A setting is malformed, out of range or contradicts another one."""


class ValidationError(SandboxError):
    """A request argument is wrong.

    Attributes:
        argument: the wire name of the offending argument (``code``, ``timeout``, ...).
    """

    def __init__(self, argument: str, message: str) -> None:
        super().__init__(f"{argument}: {message}")
        self.argument = argument
        self.message = message


class BackendUnavailableError(SandboxError):
    """A sandbox backend cannot run here, or cannot enforce the configured policy."""


class SandboxStartError(SandboxError):
    """A sandbox could not be started."""


class ChannelError(SandboxError):
    """The host <-> sandbox channel was closed or broke its protocol."""


class FrameError(ChannelError):
    """A frame was malformed, oversized, of an unknown kind or of another protocol version."""


class DownstreamError(SandboxError):
    """A downstream MCP server could not be started or reached, or a call to it failed.

    Attributes:
        server: the server's name as configured.
        tool: the tool being called, if any.
    """

    def __init__(self, server: str, message: str, tool: str | None = None) -> None:
        super().__init__(message)
        self.server = server
        self.tool = tool
        self.message = message


class ToolCallDenied(DownstreamError):
    """The run's policy forbids this call: server not allowed, tool denied, or a cap reached."""


class WorkspaceError(SandboxError):
    """A conversation's files cannot be stored, listed or read as asked (nothing stored is lost)."""


class QuotaExceededError(WorkspaceError):
    """A write would take a conversation past its byte or file quota; nothing was written.

    Attributes:
        limit: ``"bytes"`` or ``"files"``.
        used, quota: the conversation's usage and quota in that unit.
    """

    def __init__(self, limit: str, used: int, quota: int, message: str) -> None:
        super().__init__(message)
        self.limit = limit
        self.used = used
        self.quota = quota


class DiskFullError(WorkspaceError):
    """The state directory's filesystem is full (or its disk quota reached); nothing was stored.

    The message names no host path: tenants read it.
    """


class LeaseLostError(WorkspaceError):
    """This replica no longer holds the conversation's lease (another one took it): nothing was
    recorded; the same request, sent again, reaches the replica that runs the conversation now."""


class UnavailableError(WorkspaceError):
    """A service the server stores into cannot be reached now (an outage, not a refusal): nothing
    was done, and the same request, sent again later, may succeed.

    Attributes:
        service: what is down, as tenants read it ("the metadata database", "the object store").
    """

    RETRY_SECONDS = 5  # what a client is told to wait (HTTP Retry-After) before sending it again

    def __init__(self, service: str) -> None:
        super().__init__(f"{service} is unavailable: nothing was done; retry in a moment")
        self.service = service


class BusyError(SandboxError):
    """The server is at capacity; the request was refused without running anything."""
