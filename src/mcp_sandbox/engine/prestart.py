"""Pre-started single-use sandboxes, and the placement of runs that cannot fork from a zygote.

JavaScript runtimes do not fork, and a container backend has no zygote (see ``warm.py``), so
their runs would each wait for a whole sandbox to start. Instead a few sandboxes per language
are started in the background, each READY and waiting for its one EXEC frame on the channel (the
code never travels on a command line). A run takes one, is served by it exactly as a fresh
sandbox serves a run (the EXEC says ``last``), and the sandbox is then destroyed, so fresh state
holds by construction; its owner task starts the next one. A Python one runs a zygote (as a warm
sandbox does, preloading nothing) that forks the run's child in advance and reports its exit:
the run is answered then, and the sandbox's teardown comes after the answer. Sizes, retries and
which runs may take one: :class:`PrestartPool` and :func:`fits_prestarted_sandbox`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import time
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import anyio
from anyio.abc import TaskGroup

from mcp_sandbox.config import LimitSettings, PoolSettings, WorkspaceSettings
from mcp_sandbox.engine.disk import DiskBound, Overrun, disk_bound
from mcp_sandbox.engine.interpreter import Interpreter
from mcp_sandbox.engine.opener import Opener
from mcp_sandbox.engine.placement import DEATH_SETTLE_SECONDS, tool_mounts
from mcp_sandbox.engine.result import ExecutionRequest, ExecutionResult
from mcp_sandbox.engine.run_frames import RunRecord
from mcp_sandbox.engine.runtimes import limits_for
from mcp_sandbox.engine.tools_view import ToolsView
from mcp_sandbox.engine.verdict import captured, explain_file_size, judge_fresh, stopped_for_disk, timed_out
from mcp_sandbox.errors import BackendUnavailableError, SandboxStartError
from mcp_sandbox.sandbox.backends import SandboxOutcome

__all__ = [
    "DEFAULT_SIZES",
    "START_WAIT_SECONDS",
    "PrestartPlacement",
    "PrestartPool",
    "Prestarted",
    "fits_prestarted_sandbox",
    "prestart_size",
]

logger = logging.getLogger(__name__)

RETRY_SECONDS = 30.0
# Sandboxes per language when ``prestart_size`` is not set. Back to back, TypeScript runs are bound
# by how many bun starts overlap (each waits for a sandbox still starting): 4 serve them faster
# than 2 for little more memory (idle bun sandboxes share bun's pages). Python's are containers
# (podman, docker: bwrap's Python forks from a zygote), each start costly in CPU.
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


def fits_prestarted_sandbox(limits: LimitSettings, request: ExecutionRequest) -> bool:
    """Whether ``request`` may run in a pre-started sandbox: its sandbox would be the pool's.

    The pool's sandboxes have a scratch workspace, the limits of the default ``timeout``, no
    network and a ``/tools`` view that shows each run its own stubs. A run with a conversation's
    workspace, other limits, or anything else that shapes the sandbox (network: a run that asks
    for it never takes one) starts its own.
    """
    if request.workspace is not None or request.egress is not None:
        return False
    return limits_for(limits, request.timeout) == limits_for(limits, limits.timeout)


def prestart_size(pool: PoolSettings, language: str) -> int:
    """How many sandboxes of ``language`` are kept started: ``prestart_size``, else the language's default."""
    return pool.prestart_size if pool.prestart_size is not None else DEFAULT_SIZES[language]


class PrestartPool:
    """Pre-started single-use sandboxes per language.

    A language's sandboxes start on its first run (a deployment that never runs TypeScript keeps
    no bun), ``prestart_size`` of them (0: none, every run starts its own), by default
    :data:`DEFAULT_SIZES`. Only a run whose sandbox would be the same as theirs may take one (see
    :func:`fits_prestarted_sandbox`). A sandbox that cannot start (a container image that
    cannot run bun, say) is logged and its owner stops; the language's next run after
    ``RETRY_SECONDS`` tries again (runs start their own meanwhile).
    """

    def __init__(self, pool: PoolSettings, opener: Opener, uid: int | None = None) -> None:
        self.pool_settings = pool
        self._opener = opener
        self.uid = uid  # the host uid its sandboxes run as (None: sandbox_uid); see .pools_by_uid
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
        if self._group is None or prestart_size(self.pool_settings, language) == 0:
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
        for _ in range(prestart_size(self.pool_settings, language) - self._owners.get(language, 0)):
            self._start(language)

    @contextlib.asynccontextmanager
    async def _open(self, language: str) -> AsyncIterator[Prestarted]:
        """A pre-started sandbox for ``language``: as a fresh run's, with a /tools view; READY, waiting for EXEC.

        Raises:
            SandboxStartError: it did not start.
        """
        if language == "python":  # nothing preloaded: a single-use sandbox would pay for it on every run
            async with self._opener.zygote(self.uid, preload=()) as (interpreter, tools, workspace, guard):
                self._opener.pool_started("prestarted", language)
                yield Prestarted(language, interpreter, tools, workspace, guard)
        else:
            async with self._opener.single_use(language, self.uid) as (interpreter, tools, workspace):
                self._opener.pool_started("prestarted", language)
                yield Prestarted(language, interpreter, tools, workspace)

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
                async with self._open(language) as sandbox:
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


class PrestartPlacement:
    """Runs a request in a pre-started sandbox (a :class:`~.placement.Placement`), judged as a fresh one.

    The sandbox serves this run only, then its owner destroys it. With a zygote (Python) the run
    is its forked child's, judged by the zygote's EXITED and the sandbox's counters then (they are
    this run's alone), and answered before the sandbox is torn down.
    """

    def __init__(
        self, limits: LimitSettings, workspaces: WorkspaceSettings, pool: PrestartPool, *, zygotes: bool
    ) -> None:
        """``zygotes``: the backend keeps warm sandboxes (then Python runs never come here)."""
        self._limits, self._workspaces = limits, workspaces
        self._pool = pool
        self._zygotes = zygotes

    def accepts(self, request: ExecutionRequest) -> bool:
        """A run that cannot fork from a zygote, shaped like the pool's sandboxes."""
        return (request.language != "python" or not self._zygotes) and fits_prestarted_sandbox(self._limits, request)

    async def run(self, request: ExecutionRequest, started: float) -> ExecutionResult | None:
        """Run ``request`` in a ready sandbox of its language; None if none came (see :meth:`PrestartPool.take`)."""
        sandbox = await self._pool.take(request.language)
        if sandbox is None:
            return None
        limits = self._limits
        record = RunRecord.capped(limits.max_output, request.on_output)
        interpreter = sandbox.interpreter
        overrun = Overrun(DiskBound.scratch(limits, self._workspaces))
        outcome: SandboxOutcome | None = None
        try:
            with anyio.move_on_after(request.timeout) as deadline:
                async with disk_bound(sandbox.workspace, overrun.bound) as overrun:
                    await sandbox.tools.show(tool_mounts(request))
                    interpreter.take_own_output()  # what it said while it waited is no run's
                    file_size = overrun.file_size(limits.max_file_size)
                    if sandbox.guard is None:  # answered once the runner has ended, before the teardown
                        ended = await interpreter.run(record, request, last=True, file_size=file_size, early=True)
                        outcome = ended or interpreter.outcome
                    else:
                        outcome = await self._run_forked(interpreter, record, request, sandbox.guard, file_size)
            if deadline.cancelled_caught or overrun.stopped:
                await interpreter.kill()
        finally:
            sandbox.used.set()
        result = dataclasses.replace(captured(record, interpreter, started), warm=True)
        if overrun.reason is not None:
            return stopped_for_disk(result, overrun.reason, stopped=overrun.stopped)
        if deadline.cancelled_caught or (outcome is None and sandbox.guard is None):
            return timed_out(result, request, "the sandbox and all its processes were killed")
        if outcome is None:
            error = "the pre-started sandbox ended before reporting the run"
            return dataclasses.replace(result, status="error", exit_code=None, error=error)
        return explain_file_size(limits, overrun, judge_fresh(limits, outcome, record, result))

    async def _run_forked(
        self, interpreter: Interpreter, record: RunRecord, request: ExecutionRequest, guard: bytes, file_size: int
    ) -> SandboxOutcome | None:
        """Run in the child the zygote forked; how it ended (None: not known).

        The sandbox serves no other run, so its counters now are this run's.
        """
        cpu_seconds = limits_for(self._limits, request.timeout).cpu_seconds
        exited = await interpreter.run_forked(
            record, request, cpu_seconds=cpu_seconds, guard=guard, file_size=file_size
        )
        if exited is not None:
            return interpreter.sandbox.judge(exited.exit_code)
        with anyio.move_on_after(DEATH_SETTLE_SECONDS):  # the zygote died: let its outcome be known
            await interpreter.exited.wait()
        return interpreter.outcome
