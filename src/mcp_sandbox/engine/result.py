"""Execution requests and results: the engine's input and output, independent of MCP."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any, Literal, Protocol

from mcp_sandbox.egress import EgressGrant
from mcp_sandbox.engine.fork_state import ForkState
from mcp_sandbox.protocol import Call, Forked, Reply
from mcp_sandbox.sandbox.policy import Mount

__all__ = [
    "EXIT_TIMEOUT",
    "ExecutionRequest",
    "ExecutionResult",
    "Image",
    "OutputListener",
    "SessionState",
    "Status",
    "ToolAccess",
]

Status = Literal["success", "error", "timeout", "validation_error"]
# "new": the run started a fresh interpreter for its session; "kept": earlier runs' variables were there;
# "resumed": a fresh interpreter loaded the session's parked variables first (engine/parking.py).
SessionState = Literal["new", "kept", "resumed"]

EXIT_TIMEOUT = 124  # as GNU timeout(1)

# Called with "stdout" or "stderr" and each chunk a run writes, as it comes; must not block.
OutputListener = Callable[[Literal["stdout", "stderr"], bytes], None]


class ToolAccess(Protocol):
    """What one run may reach of the downstream MCP servers (code mode), and who answers for it.

    The engine binds ``mounts`` (the generated stubs) into the sandbox, tells the runtime which
    ``servers`` (aliases) it may call, and hands every CALL frame from the sandbox to ``handle``,
    concurrently; the REPLY goes back as it is. ``handle`` never raises for what the sandbox asked.
    """

    @property
    def mounts(self) -> tuple[Mount, ...]: ...

    @property
    def servers(self) -> tuple[str, ...]: ...

    async def handle(self, call: Call) -> Reply: ...


@dataclass(frozen=True, slots=True)
class ExecutionRequest:
    """One piece of code to run. Validated by the caller (see ``server/tools/arguments.py``).

    ``environment`` is this run's own (plus the sandbox's base environment); it travels to the
    runner in the EXEC frame, never on a command line. ``session`` is an opaque key chosen by the
    caller: runs with the same key share one interpreter (variables, imports) while it lives; None
    runs in a fresh sandbox. ``reset`` starts the session's interpreter afresh.
    """

    code: str
    timeout: float
    language: str = "python"
    environment: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    workspace: Path | None = None  # a persistent directory, or None for a fresh one per run (or session)
    tools: ToolAccess | None = None  # code mode: the downstream servers this run may call
    session: str | None = None
    reset: bool = False
    on_output: OutputListener | None = None  # sees the run's output while it lasts (progress notifications)
    egress: EgressGrant | None = None  # network through the egress proxy: always a fresh sandbox of its own
    tenant: str = "default"  # whose run: admission and session caps are per tenant
    # A fork's first run: its source's variables, spooled (see Engine.fork_source); the caller closes it.
    fork_state: ForkState | None = None


@dataclass(frozen=True, slots=True)
class Image:
    """An image the code showed (``plt.show()``) or saved (``savefig``): its mime type and bytes."""

    mime: str
    data: bytes


@dataclass(frozen=True, slots=True)
class ExecutionResult:
    """What happened. ``structured()`` is the contract's ``structuredContent``."""

    status: Status
    exit_code: int | None
    stdout: str = ""
    stderr: str = ""
    duration_ms: int = 0
    truncated: bool = False
    error: str | None = None  # the host's explanation: timeout, memory limit, crash, bad argument
    session: SessionState | None = None  # None: the run had no session
    images: tuple[Image, ...] = ()  # not in structured(): the MCP layer sends them as image content
    images_dropped: int = 0  # images the run sent past the caps, or malformed: not returned
    warm: bool = False  # a warm sandbox's forked interpreter ran it (not in structured())
    limits: tuple[str, ...] = ()  # limits hit: memory, pids, cpu, file_size, disk, timeout (not in structured())
    path: str = "fresh"  # where the engine placed it: warm, session, born, prestarted, fresh (not in structured())
    born: bool = False  # its new session was born of a session-ready sandbox (path "born"; not in structured())
    forked: Forked | None = None  # a fork's first run: what it carried of its source's variables (not in structured())

    def structured(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "status": self.status,
            "exitCode": self.exit_code,
            "stdout": self.stdout,
            "stderr": self.stderr,
            "durationMs": self.duration_ms,
            "truncated": self.truncated,
        }
        if self.error is not None:
            data["error"] = self.error
        if self.session is not None:
            data["session"] = self.session
        if self.session == "resumed" and self.forked is not None and self.forked.skipped:
            data["notKept"] = list(self.forked.skipped)
        if self.images_dropped:
            data["imagesDropped"] = self.images_dropped
        return data

    @classmethod
    def invalid(cls, message: str) -> ExecutionResult:
        """A ``validation_error`` result naming what was wrong."""
        return cls(status="validation_error", exit_code=None, error=message)
