"""Pre-started single-use sandboxes: for runs that cannot fork from a zygote.

JavaScript runtimes do not fork, and a container backend has no zygote (see ``warm.py``), so
their runs would each wait for a whole sandbox to start (bun ~40 ms, a podman or docker
container hundreds). Instead a few sandboxes per language are started in the background: each
has started its runtime, said READY and waits for its one EXEC frame on the channel (the code
never travels on a command line). A run takes one, is served by it exactly as a fresh sandbox
serves a run (the EXEC says ``last``: the runtime exits after it), and the sandbox is then
destroyed, so fresh state holds by construction; its owner task starts the next one. A Python
one runs a zygote (as a warm sandbox does, preloading nothing) that forks the run's child in
advance and reports its exit: the run is answered then, and the sandbox's teardown (a
container engine's takes tens of milliseconds) comes after the answer.

A language's sandboxes start on its first run (a deployment that never runs TypeScript keeps
no bun), ``prestart_size`` of them (0: none, every run starts its own), by default
:data:`DEFAULT_SIZES`. Only a run whose sandbox
would be the same as theirs may take one: see :func:`eligible`. A sandbox that cannot start
(a container backend refuses TypeScript, say) is logged and its owner stops; the language's
next run after ``RETRY_SECONDS`` tries again (runs start their own meanwhile).
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from pathlib import Path

import anyio
from anyio.abc import TaskGroup

from mcp_sandbox.config import Settings
from mcp_sandbox.engine.interpreter import Interpreter
from mcp_sandbox.engine.result import ExecutionRequest
from mcp_sandbox.engine.runtimes import limits_for
from mcp_sandbox.engine.sessions import ToolsView
from mcp_sandbox.errors import BackendUnavailableError, SandboxStartError

__all__ = [
    "DEFAULT_SIZES",
    "START_WAIT_SECONDS",
    "PrestartOpener",
    "PrestartPool",
    "Prestarted",
    "eligible",
    "prestart_size",
]

logger = logging.getLogger(__name__)

RETRY_SECONDS = 30.0
# Sandboxes per language when ``prestart_size`` is not set. Back to back, TypeScript runs are bound
# by how many bun starts overlap (each waits for a sandbox still starting): over stdio here, 12-14
# ms per run with 2, 9-11 with 4, for 7 MiB more PSS in all (4 idle bun sandboxes 10.3 MiB each, 2
# of them 17 MiB each: they share bun's pages). Python's are containers (podman, docker: bwrap's
# Python forks from a zygote), each start a few hundred ms of CPU.
DEFAULT_SIZES: Mapping[str, int] = {"typescript": 4, "javascript": 4, "python": 2}
# A run that finds none ready but one starting waits this long for it before starting its own.
START_WAIT_SECONDS = 5.0


@dataclass(eq=False)
class Prestarted:
    """One pre-started sandbox: its runner (READY, waiting for EXEC), its ``/tools`` view, its scratch workspace.

    A Python one's runner is a zygote (``guard``: the seccomp filter of the child it forks for
    the run), so the run is judged by the zygote's EXITED, which the code cannot forge, and is
    answered as soon as the child has exited, before the sandbox is torn down.
    """

    language: str
    interpreter: Interpreter
    tools: ToolsView
    workspace: Path | None  # None: the backend's own sized scratch space
    guard: bytes | None = None  # the zygote's runs' seccomp guard; None: the runner serves the run itself
    used: anyio.Event = field(default_factory=anyio.Event)


# Starts one pre-started sandbox for a language (READY received) and destroys it on the way out.
PrestartOpener = Callable[[str], AbstractAsyncContextManager[Prestarted]]


def eligible(settings: Settings, request: ExecutionRequest) -> bool:
    """Whether ``request`` may run in a pre-started sandbox: its sandbox would be the pool's.

    The pool's sandboxes have a scratch workspace, the limits of the default ``timeout``, no
    network and a ``/tools`` view that shows each run its own stubs. A run with a conversation's
    workspace, other limits, or anything else that shapes the sandbox (network: a run that asks
    for it never takes one) starts its own.
    """
    if request.workspace is not None or request.egress is not None:
        return False
    return limits_for(settings, request.timeout) == limits_for(settings, settings.timeout)


def prestart_size(settings: Settings, language: str) -> int:
    """How many sandboxes of ``language`` are kept started: ``prestart_size``, else the language's default."""
    return settings.prestart_size if settings.prestart_size is not None else DEFAULT_SIZES[language]


class PrestartPool:
    """Pre-started single-use sandboxes per language; see the module docstring."""

    def __init__(self, settings: Settings, opener: PrestartOpener) -> None:
        self.settings = settings
        self._opener = opener
        self._ready: dict[str, list[Prestarted]] = {}
        self._starting: dict[str, int] = {}
        self._owners: dict[str, int] = {}
        self._retry_at: dict[str, float] = {}
        self._waiting: dict[str, int] = {}
        self._offered = anyio.Event()  # set (and replaced) whenever one is offered or fails to start
        self._group: TaskGroup | None = None

    def ready(self, language: str) -> int:
        """Sandboxes of ``language`` waiting for a run."""
        return len(self._ready.get(language, ()))

    def size(self, language: str) -> int:
        """Sandboxes of ``language`` starting, waiting for a run or serving one."""
        return self._owners.get(language, 0)

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[PrestartPool]:
        """Keep pre-started sandboxes for this block; every one is destroyed on the way out."""
        async with anyio.create_task_group() as group:
            self._group = group
            try:
                yield self
            finally:
                self._group = None
                self._ready.clear()
                group.cancel_scope.cancel()

    async def take(self, language: str) -> Prestarted | None:
        """A ready sandbox of ``language``, or None (then the run starts its own).

        The first call for a language starts its sandboxes. With none ready but more starting
        than runs waiting for them, waits at most ``START_WAIT_SECONDS`` for one.
        """
        if self._group is None or prestart_size(self.settings, language) == 0:
            return None
        ready = self._ready.setdefault(language, [])
        self.fill(language)
        if not ready and self._starting.get(language, 0) > self._waiting.get(language, 0):
            self._waiting[language] = self._waiting.get(language, 0) + 1
            try:
                with anyio.move_on_after(START_WAIT_SECONDS):
                    while not ready and self._starting.get(language, 0):
                        await self._offered.wait()
            finally:
                self._waiting[language] -= 1
        return ready.pop(0) if ready else None

    def fill(self, language: str) -> None:
        """Start sandboxes of ``language`` up to ``prestart_size`` now, as its next run would."""
        if self._group is None or time.monotonic() < self._retry_at.get(language, 0.0):
            return
        self._ready.setdefault(language, [])
        for _ in range(prestart_size(self.settings, language) - self._owners.get(language, 0)):
            self._start(language)

    def _start(self, language: str) -> None:
        assert self._group is not None
        self._starting[language] = self._starting.get(language, 0) + 1
        self._owners[language] = self._owners.get(language, 0) + 1
        self._group.start_soon(self._own, language)

    def _announce(self) -> None:
        self._offered.set()
        self._offered = anyio.Event()

    async def _own(self, language: str) -> None:
        """Start a sandbox of ``language``, offer it, destroy it once used; again and again."""
        try:
            await self._serve(language)
        finally:
            self._owners[language] -= 1

    async def _serve(self, language: str) -> None:
        while True:
            try:
                async with self._opener(language) as sandbox:
                    self._starting[language] -= 1
                    self._ready[language].append(sandbox)
                    self._announce()
                    try:
                        await sandbox.used.wait()
                    finally:
                        self._starting[language] += 1  # counted as starting again from here
                # The next one starts once this one is torn down: not beside its run (on two
                # cores a start beside the run slows it several times over), nor right after its
                # answer (a start's fork on the event loop would hold the answer back).
            except (SandboxStartError, BackendUnavailableError) as exc:
                # Its owner stops; a run of the language after RETRY_SECONDS starts it again.
                self._starting[language] -= 1
                self._retry_at[language] = time.monotonic() + RETRY_SECONDS
                self._announce()
                logger.error("a pre-started %s sandbox did not start; runs start their own for now: %s", language, exc)
                return
            if self._group is None:
                return
