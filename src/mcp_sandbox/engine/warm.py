"""Warm sandboxes: a pool of zygotes, and the placement of runs that fork a fresh interpreter from one.

A warm sandbox is started once (the runtime and ``pool_preload`` modules imported, its cgroup
joined) and then serves one run at a time: its zygote has forked the child for the next run in
advance, and after the child exits it reports the exit, then kills every process the run left,
empties ``/tmp``, ``/dev/shm`` and ``/workspace``, removes its IPC objects, forks the next child
and says READY (see the runner's ``zygote.py``). A run never sees another run's state, and the
per-run cost is neither a sandbox start nor a fork nor a restore. How the pool grows, shrinks
and chooses between preloading and light sandboxes: :class:`WarmPool`; how a run is served in
one: :mod:`.warm_placement`.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import anyio
from anyio.abc import TaskGroup

from mcp_sandbox.config import PoolSettings
from mcp_sandbox.engine.interpreter import Interpreter
from mcp_sandbox.engine.opener import Opener
from mcp_sandbox.engine.result import ExecutionRequest
from mcp_sandbox.engine.runtimes import needs_preload
from mcp_sandbox.engine.tools_view import ToolsView
from mcp_sandbox.errors import BackendUnavailableError, SandboxStartError
from mcp_sandbox.sandbox.backends import LimitEvents

__all__ = [
    "CONVERT_SECONDS",
    "RESTORE_SECONDS",
    "RESTORE_WAIT_SECONDS",
    "RETRY_SECONDS",
    "RUNS_PER_SANDBOX",
    "Warm",
    "WarmPool",
    "fits_warm_sandbox",
]

logger = logging.getLogger(__name__)

RUNS_PER_SANDBOX = 1000  # then a fresh zygote: its own CPU time (forks, restores) adds up
RETRY_SECONDS = 30.0
# A run that finds no idle sandbox but one being restored (that is quick) waits this long for it, not a cold start.
RESTORE_WAIT_SECONDS = 0.2
# A full pool retires a sandbox for one of the other kind at most this often (each is a start).
CONVERT_SECONDS = 5.0
RESTORE_SECONDS = 60.0  # a run may leave a million files to remove; past this the sandbox is replaced


def fits_warm_sandbox(request: ExecutionRequest) -> bool:
    """Whether ``request`` may run in a warm sandbox: a Python run on a scratch workspace, without network.

    The zygote's sandbox has no network and a scratch workspace; each run's CPU limit comes with
    its EXEC frame, so its timeout does not matter. A run granted network never takes one.
    """
    return request.language == "python" and request.workspace is None and request.egress is None


@dataclass(eq=False)
class Warm:
    """One warm sandbox: its zygote's interpreter, its ``/tools`` view, the seccomp guard of its runs."""

    interpreter: Interpreter
    tools: ToolsView
    guard: bytes
    runs: int = 0
    idle_since: float = field(default_factory=time.monotonic)
    back: anyio.Event = field(default_factory=anyio.Event)  # it came back from a run, or was retired
    # The sandbox's limit counters when it was last offered: a run's hits are the counters after it minus these.
    limits: LimitEvents = field(default_factory=LimitEvents)
    preloaded: bool = True  # its zygote imported ``pool_preload``
    reusable: bool = False  # when back: the run left it able to serve again (once restored)
    shrunk: bool = False  # retired for being idle: its owner does not start another
    successor: bool | None = None  # retired for a sandbox of the other kind: whether that one preloads


class WarmPool:
    """Warm sandboxes for runs without a conversation.

    A warm sandbox is of one of two kinds: a preloading one (its zygote imported ``pool_preload``)
    or a light one (nothing imported: its fork, its child's page faults and exit cost far
    less). A run whose code names a ``pool_preload`` module (a plain substring test: code that
    imports one by a computed name still works, only slower) takes a preloading one; any other run
    takes a light one, or a preloading one if no light one comes back within
    ``RESTORE_WAIT_SECONDS``. With ``pool_preload`` empty every sandbox is light.

    The pool keeps between ``pool_min`` and ``pool_size`` warm sandboxes of both kinds together;
    the first of the ``pool_min`` is a preloading one, the others light (shrinking keeps one
    preloading sandbox while ``pool_min`` > 0), and the pool grows with the kind its runs ask for.
    A run that asks for a preloading sandbox when the pool is full and one of its light ones idle
    retires that one for a preloading one; a light run that finds no light sandbox at all retires an
    idle preloading one (never the last) for a light one; at most one such swap every
    ``CONVERT_SECONDS``, since each starts a sandbox. A run takes an idle one
    if there is one; if not, the pool grows by one in the background and the run waits (at most
    ``RESTORE_WAIT_SECONDS``) for one being restored, or else runs in a sandbox of its own (the cold
    path). A sandbox unused for ``pool_idle`` goes (down to ``pool_min``); one whose run timed out,
    whose zygote died or could not restore it, or that served ``RUNS_PER_SANDBOX`` runs is
    replaced; after a run its owner waits for the zygote's READY (at most ``RESTORE_SECONDS``)
    before it offers it again. Each sandbox is owned by one task of the pool's task
    group, which enters and exits its context; a sandbox that cannot start stops the pool's growth
    for ``RETRY_SECONDS`` (runs go cold meanwhile) and is logged.
    """

    def __init__(self, pool: PoolSettings, opener: Opener, uid: int | None = None) -> None:
        self.pool_settings = pool
        self._opener = opener
        self.uid = uid  # the host uid its sandboxes run as (None: sandbox_uid); see .pools_by_uid
        self._preload_reported = False
        self._idle: list[Warm] = []  # the most recently used last: it is taken first
        self._owners = 0  # sandboxes starting, idle or running
        self._up = 0  # sandboxes started (READY), idle or running
        self._light_up = 0  # light ones of those
        self._group: TaskGroup | None = None
        self._retry_at = 0.0
        self._converted_at = -CONVERT_SECONDS
        self._restoring = {False: 0, True: 0}  # sandboxes back from a run, not yet restored, by kind
        self._preloading = 0  # preloading sandboxes starting, idle or running
        self._offered = anyio.Event()  # set (and replaced) whenever a sandbox is offered or retired

    @property
    def size(self) -> int:
        """Warm sandboxes starting, idle or serving a run."""
        return self._owners

    @property
    def idle(self) -> int:
        return len(self._idle)

    @property
    def up(self) -> int:
        """Warm sandboxes that have started (idle or serving a run)."""
        return self._up

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[WarmPool]:
        """Keep the pool for this block (``pool_min`` sandboxes start now); every sandbox stops on the way out."""
        async with anyio.create_task_group() as group:
            self._group = group
            for index in range(self.pool_settings.pool_min):
                self._grow(preloaded=index == 0)
            if self.pool_settings.pool_size > self.pool_settings.pool_min:
                group.start_soon(self._shrink_when_idle)
            try:
                yield self
            finally:
                self._group = None
                self._idle.clear()
                group.cancel_scope.cancel()

    def needs_preload(self, code: str) -> bool:
        """Whether ``code`` names a ``pool_preload`` module (see :func:`.runtimes.needs_preload`)."""
        return needs_preload(self.pool_settings, code)

    async def take(self, *, preloaded: bool = True) -> Warm | None:
        """An idle warm sandbox (a preloading one if ``preloaded``), or None; with none idle the pool grows if it may.

        A run that does not need the preloads takes a light sandbox, else a preloading one. With
        none idle but some serving a run or being restored, it waits at most
        ``RESTORE_WAIT_SECONDS`` for one; a run that may be light waits for a light one that has
        started (it costs less CPU than a preloading one) rather than take an idle preloading one.
        """
        if self._group is None:
            return None
        preloaded = preloaded and bool(self.pool_settings.pool_preload)  # else every sandbox is light
        if (warm := self._pick(preloaded, light=self._light_busy() > 0)) is not None:
            if not preloaded and self._owners == self._preloading:  # a light run, and not one light sandbox
                self._convert(False)
            return warm
        if time.monotonic() >= self._retry_at:
            if self._owners < self.pool_settings.pool_size:
                self._grow(preloaded=preloaded)
            else:
                self._convert(preloaded)
        with anyio.move_on_after(RESTORE_WAIT_SECONDS):
            restoring = self._restoring
            while (warm := self._pick(preloaded, light=self._light_busy() > 0)) is None and (
                restoring[True] or (not preloaded and (restoring[False] or self._light_busy()))
            ):
                await self._offered.wait()
        return warm if warm is not None else self._pick(preloaded)

    def _light_busy(self) -> int:
        """Light sandboxes started and not idle: serving a run or being restored."""
        return self._light_up - sum(not warm.preloaded for warm in self._idle)

    def _pick(self, preloaded: bool, *, light: bool = False) -> Warm | None:
        """The most recently used idle sandbox that serves such a run: a light one first when it may be light.

        With ``light``, a run that may be light takes only a light one.
        """
        for kind in (True,) if preloaded else (False,) if light else (False, True):
            for index in range(len(self._idle) - 1, -1, -1):
                if self._idle[index].preloaded == kind:
                    return self._idle.pop(index)
        return None

    def _convert(self, preloaded: bool) -> None:
        """Retire the least recently used idle sandbox of the other kind for one that is ``preloaded``
        or light, when the pool is full: never the last preloading one, at most every ``CONVERT_SECONDS``."""
        now = time.monotonic()
        if self._owners < self.pool_settings.pool_size or now - self._converted_at < CONVERT_SECONDS:
            return
        if not preloaded and self._preloading <= 1:
            return
        for warm in sorted(self._idle, key=lambda w: w.idle_since):
            if warm.preloaded != preloaded:
                self._converted_at = now
                self._idle.remove(warm)
                warm.successor = preloaded
                warm.reusable = False
                warm.back.set()
                return

    def give_back(self, warm: Warm, *, reusable: bool) -> None:
        """Return ``warm`` after a run: offered again once restored if ``reusable`` (and young enough)."""
        warm.runs += 1
        warm.reusable = reusable and warm.runs < RUNS_PER_SANDBOX and self._group is not None
        self._restoring[warm.preloaded] += warm.reusable  # counted now: a run may ask for it before its owner wakes
        warm.back.set()

    @contextlib.asynccontextmanager
    async def _open(self, preloaded: bool) -> AsyncIterator[Warm]:
        """A warm sandbox as ``uid`` (see :meth:`.opener.Opener.zygote`), preloading ``pool_preload`` if ``preloaded``.

        Raises:
            SandboxStartError: it did not start, or its zygote cannot fork safely.
        """
        async with self._opener.zygote(self.uid, preload=None if preloaded else ()) as (interpreter, tools, _, guard):
            self._opener.pool_started("warm", "python")
            if (failed := interpreter.ready.failed) and not self._preload_reported:
                self._preload_reported = True
                logger.warning("pool_preload: these modules did not import in the sandbox: %s", failed)
            yield Warm(interpreter, tools, guard, preloaded=preloaded)

    def _grow(self, *, preloaded: bool) -> None:
        assert self._group is not None
        self._owners += 1
        self._group.start_soon(self._own, preloaded and bool(self.pool_settings.pool_preload))

    async def _own(self, preloaded: bool) -> None:
        """Start a warm sandbox, offer it, stop it when retired; start the next unless it was shrunk.

        The next is of the same kind unless the sandbox was retired for one of the other kind.
        """
        try:
            while True:
                self._preloading += preloaded
                try:
                    async with self._open(preloaded) as warm:
                        self._up += 1
                        self._light_up += not preloaded
                        try:
                            await self._serve(warm)
                        finally:
                            self._up -= 1
                            self._light_up -= not preloaded
                except (SandboxStartError, BackendUnavailableError) as exc:
                    self._retry_at = time.monotonic() + RETRY_SECONDS
                    logger.error("a warm sandbox did not start; runs start sandboxes of their own for now: %s", exc)
                    return
                finally:
                    self._preloading -= preloaded
                if warm.shrunk or self._group is None:
                    return
                if warm.successor is not None:
                    preloaded = warm.successor
        finally:
            self._owners -= 1

    async def _serve(self, warm: Warm) -> None:
        """Offer ``warm``, and again after each run once its zygote has restored it; return when it is retired."""
        while True:
            warm.back = anyio.Event()
            warm.idle_since = time.monotonic()
            # Read now, off the next run's path: nothing runs in the sandbox until its EXEC.
            warm.limits = warm.interpreter.limit_events()
            self._idle.append(warm)
            self._announce()
            await warm.back.wait()
            reusable = warm.reusable
            problem: str | None = "retired"
            if reusable:
                problem = "it did not restore the sandbox in time"
                try:
                    with anyio.move_on_after(RESTORE_SECONDS):
                        problem = await warm.interpreter.restored()
                finally:
                    self._restoring[warm.preloaded] -= 1
            if problem is not None:
                if reusable:
                    logger.info("a warm sandbox is replaced: %s", problem)
                self._announce()  # whoever waits for a restore goes on without this one
                return

    def _announce(self) -> None:
        self._offered.set()
        self._offered = anyio.Event()

    async def _shrink_when_idle(self) -> None:
        idle_for = self.pool_settings.pool_idle
        while True:
            await anyio.sleep(min(idle_for / 2, 60.0))
            now = time.monotonic()
            remaining = self._owners  # each owner counts itself out only once its sandbox has stopped
            preloading = self._preloading
            # The least recently used first, never below pool_min, and the last preloading one kept with it.
            for warm in sorted(self._idle, key=lambda w: w.idle_since):
                if remaining <= self.pool_settings.pool_min or now - warm.idle_since < idle_for:
                    break
                if warm.preloaded and preloading <= 1 and self.pool_settings.pool_min > 0:
                    continue
                preloading -= warm.preloaded
                self._idle.remove(warm)
                warm.shrunk = True
                warm.reusable = False
                warm.back.set()
                remaining -= 1
