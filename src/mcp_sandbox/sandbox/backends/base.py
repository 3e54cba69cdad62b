"""The backend interface: a tiny Protocol, a probe that says what a backend can enforce here.

A backend starts a :class:`Sandbox` from a :class:`~mcp_sandbox.sandbox.policy.SandboxPolicy`.
A sandbox is a running, isolated process tree with three host-side ends: its stdout, its
stderr and a channel socket for typed frames. A one-shot run starts a sandbox, sends one
EXEC frame and closes it; a long-lived sandbox keeps serving frames (sessions, warm pools)
until it is closed. Either way :meth:`Sandbox.aclose` kills the whole tree, bounded.
"""

from __future__ import annotations

import asyncio
import socket
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from typing import Protocol

from mcp_sandbox.sandbox.policy import SandboxPolicy

__all__ = ["Backend", "BackendProbe", "Capability", "LimitEvents", "Sandbox", "SandboxOutcome"]


@dataclass(frozen=True, slots=True)
class Capability:
    """One part of the policy and whether (and how) this backend enforces it on this host."""

    name: str
    enforced: bool
    detail: str = ""


@dataclass(frozen=True, slots=True)
class BackendProbe:
    """A backend's availability on this host, and what it can enforce."""

    name: str
    available: bool
    reason: str = ""
    version: str = ""
    capabilities: tuple[Capability, ...] = field(default_factory=tuple)

    def missing(self) -> list[Capability]:
        """The parts of the default policy this backend cannot enforce here."""
        return [c for c in self.capabilities if not c.enforced]

    def missing_summary(self) -> str:
        """The missing parts with each reason said once.

        A detail ``"fallback: reason"`` (bwrap's three cgroup limits share one reason) is grouped by
        its reason: ``memory limit (RLIMIT_AS only), pids limit (...): no memory cgroup here``.
        """
        by_reason: dict[str, list[str]] = {}
        for capability in self.missing():
            fallback, colon, reason = capability.detail.partition(": ")
            if not colon:
                fallback, reason = "", capability.detail
            by_reason.setdefault(reason, []).append(f"{capability.name} ({fallback})" if fallback else capability.name)
        return "; ".join(
            f"{', '.join(names)}: {reason}" if reason else ", ".join(names) for reason, names in by_reason.items()
        )


@dataclass(frozen=True, slots=True)
class SandboxOutcome:
    """How a sandbox's process tree ended."""

    returncode: int
    memory_exceeded: bool = False
    pids_exhausted: bool = False


@dataclass(frozen=True, slots=True)
class LimitEvents:
    """How often a sandbox has run into its memory and pids limits so far (counters only grow).

    A warm sandbox serves many runs; the difference before and after one run says whether
    that run hit a limit.
    """

    memory: int = 0
    pids: int = 0


class Sandbox(Protocol):
    """A running sandbox, seen from the host."""

    stdout: asyncio.StreamReader
    stderr: asyncio.StreamReader
    channel: socket.socket

    async def wait(self) -> SandboxOutcome:
        """Wait until the sandbox's process tree has ended."""
        ...

    def limit_events(self) -> LimitEvents:
        """The limit counters now (zeros where the backend cannot tell)."""
        ...

    def judge(self, returncode: int) -> SandboxOutcome:
        """The outcome of a run that ended with ``returncode``, by the limit counters now.

        For a single-use sandbox whose run's end is known before its processes are gone (its
        runner's DONE): the counters are read as ``wait`` would read them once they were.
        """
        ...

    def watch_runner(self) -> None:
        """Note which process is the runner (called at its READY, before any code ran); see :meth:`runner_ended`."""
        ...

    def runner_ended(self) -> SandboxOutcome | None:
        """The outcome, if the runner has ended and nothing else runs, before the sandbox is torn down; else None.

        Judged by what the code cannot forge (the kernel's view of the runner), as :meth:`judge`
        judges. None where the backend cannot tell: then :meth:`wait` says.
        """
        ...

    async def aclose(self) -> SandboxOutcome:
        """Kill the whole process tree (orphans included), release its resources, bounded.

        Safe to call more than once and from a cancelled task.
        """
        ...


class Backend(Protocol):
    """A way of running a policy-confined process tree."""

    name: str
    # Whether the engine keeps warm sandboxes (forking zygotes) on this backend; see engine/warm.py.
    warm_pool: bool
    # Whether a policy without a workspace gets a sized tmpfs at /workspace from the backend (a
    # scratch workspace bounded by ``limits.workspace_size`` when written); else the engine binds
    # a host directory it watches (see engine/disk.py).
    sized_scratch: bool

    def probe(self) -> BackendProbe:
        """Say whether this backend works here and which parts of the policy it enforces."""
        ...

    def running(self) -> AbstractAsyncContextManager[object]:
        """Do the backend's background work for this block (bwrap: first processes admitted ahead
        of the starts); whatever it keeps is released on the way out. Starts work without it."""
        ...

    async def start(self, policy: SandboxPolicy) -> Sandbox:
        """Start a sandbox.

        Raises:
            BackendUnavailableError: the backend cannot run here.
            SandboxStartError: the sandbox could not be started.
        """
        ...
