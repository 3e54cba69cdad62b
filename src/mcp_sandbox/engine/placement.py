"""Where a run goes: the :class:`Placement` protocol the engine routes by, and what placements share.

A placement is one way to run a request: a fresh sandbox (:mod:`.fresh`), a warm one
(:mod:`.warm`), a pre-started one (:mod:`.prestart`) or a session's (:mod:`.sessions`), each
beside the pool it takes its sandboxes from.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Protocol

from mcp_sandbox.engine.result import ExecutionRequest, ExecutionResult
from mcp_sandbox.sandbox.policy import Mount

__all__ = ["DEATH_SETTLE_SECONDS", "Placement", "Shared", "tool_mounts"]

# Whether another run is using a workspace now (a session is then not born of a session-ready sandbox on it).
Shared = Callable[[Path], bool]

# How long a zygote that died during a run may take to be seen gone (for its outcome).
DEATH_SETTLE_SECONDS = 2.0


class Placement(Protocol):
    """One way to run a request, and which requests it may run."""

    def accepts(self, request: ExecutionRequest) -> bool:
        """Whether ``request`` may run here: its sandbox would be the one this placement gives."""
        ...

    async def run(self, request: ExecutionRequest, started: float) -> ExecutionResult | None:
        """Run ``request`` (admitted at ``started``) and judge it; None: no sandbox was free, nothing ran.

        Raises:
            SandboxStartError: the sandbox could not be started at all.
            BusyError: the run needs a new session and every session is busy.
            ValueError: the run's ``tools`` mount stubs elsewhere than ``/tools/<alias>``.
        """
        ...


def tool_mounts(request: ExecutionRequest) -> tuple[Mount, ...]:
    """The stubs ``request`` shows under ``/tools`` (none without code mode)."""
    return tuple(request.tools.mounts) if request.tools is not None else ()
