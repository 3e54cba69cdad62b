"""The engine: routes each execution request to a placement and owns what runs beside the runs.

Every run first takes a slot of the admission control (:mod:`.admission`), then goes to the first
placement (:mod:`.placement`) that accepts it and has a sandbox for it: its session's interpreter
(:mod:`.sessions`; a new one is born of a session-ready sandbox of its tenant's host uid,
:mod:`.ready_by_uid`, where one fits), a warm sandbox's forked child (:mod:`.warm`), a pre-started
single-use sandbox (:mod:`.prestart`), else a fresh sandbox of its own (:mod:`.fresh`); warm and pre-started ones
of its tenant's host uid only (:mod:`.pools_by_uid`). A run granted network never takes a warm or
pre-started sandbox. Sessions and the pools need an owner for their sandboxes:
``async with engine.running():``. A run with a ``session`` key outside it raises
``RuntimeError``; runs without one work either way (cold).
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path

from mcp_sandbox import tracing
from mcp_sandbox.config import EngineSettings
from mcp_sandbox.egress import Resolver, TenantEgress, system_resolver
from mcp_sandbox.engine.admission import Admission
from mcp_sandbox.engine.fork_state import ForkState, Spool
from mcp_sandbox.engine.fresh import FreshPlacement
from mcp_sandbox.engine.interpreter import Interpreter
from mcp_sandbox.engine.opener import Opener
from mcp_sandbox.engine.parking import ParkedStates
from mcp_sandbox.engine.placement import Placement
from mcp_sandbox.engine.pools_by_uid import PoolsByUid
from mcp_sandbox.engine.prestart import PrestartPool
from mcp_sandbox.engine.ready import ReadyPool
from mcp_sandbox.engine.ready_by_uid import ReadyByUid
from mcp_sandbox.engine.result import ExecutionRequest, ExecutionResult
from mcp_sandbox.engine.scratch import sweep_scratch
from mcp_sandbox.engine.session_runs import SessionPlacement
from mcp_sandbox.engine.sessions import SessionManager
from mcp_sandbox.engine.warm import WarmPool
from mcp_sandbox.events import EventHub, RunAdmitted
from mcp_sandbox.sandbox.backends import Backend
from mcp_sandbox.state import StateLayout
from mcp_sandbox.tenant_uids import TenantUids
from mcp_sandbox.workspace.changes import ChangeGate

__all__ = ["Engine", "Prepare"]

# What a run needs done once admitted (see Engine.execute).
Prepare = Callable[[ExecutionRequest], Awaitable[ExecutionRequest]]


class Engine:
    """Runs execution requests on a backend: in a session's sandbox, a pooled one or a fresh one."""

    def __init__(
        self,
        settings: EngineSettings,
        backend: Backend,
        events: EventHub | None = None,
        *,
        layout: StateLayout,
        egress: TenantEgress,
        uids: TenantUids | None = None,
        egress_resolver: Resolver = system_resolver,
        gate: ChangeGate | None = None,
    ) -> None:
        """``layout``, ``egress``, ``uids``: the state directory, the tenants' egress rules and host uids,
        which the server builds once and shares (the uids made from ``settings.sandbox`` when not given);
        ``egress_resolver``: how the egress proxy resolves names (tests give a table of their own hosts);
        ``gate``: the conversations' change locks, shared with the workspace store (``workspace.changes``).
        (:func:`~.startup.engine_for` builds all of them from a ``Settings``.)
        """
        self.settings = settings
        self.gate = ChangeGate() if gate is None else gate
        self.backend = backend
        self.events = events if events is not None else EventHub()
        self._opener = Opener(
            settings,
            backend,
            egress_resolver=egress_resolver,
            emit=self.events.emit,
            layout=layout,
            uids=TenantUids(settings.sandbox, layout) if uids is None else uids,
            egress=egress,
        )
        self._ready = ReadyByUid(settings, self._opener, zygotes=backend.warm_pool)
        self._sessions = SessionManager(settings, self._opener, self._ready, self.gate)
        self._using: collections.Counter[Path] = collections.Counter()  # runs per workspace now
        self._pools = PoolsByUid(settings, self._opener, zygotes=backend.warm_pool)
        self._admission = Admission(
            settings.admission.max_concurrent_runs,
            settings.admission.max_queued_runs,
            settings.admission.queue_timeout,
            tenant_limit=settings.admission.tenant_concurrent_runs,
            tenant_queue=settings.admission.tenant_queued_runs,
        )
        # Asked in this order; the fresh placement takes whatever none of them did. The names are
        # the results' ``path`` (the metrics' label).
        self._placements: tuple[tuple[str, Placement], ...] = (
            ("session", SessionPlacement(settings, self._sessions, self._opener, self._shared)),
            ("warm", self._pools.placement("warm")),
            ("prestarted", self._pools.placement("prestarted")),
        )
        self._fresh = FreshPlacement(settings, self._opener)

    @property
    def layout(self) -> StateLayout:
        """The state directory's layout the engine's sandboxes use."""
        return self._opener.layout

    @property
    def tenant_uids(self) -> TenantUids:
        """The host uid of each tenant's sandboxes (see :mod:`mcp_sandbox.tenant_uids`)."""
        return self._opener.tenant_uids

    def prepare(self) -> None:
        """Create the directories runs need under the state directory (idempotent; see :mod:`mcp_sandbox.state`).

        Raises:
            OSError: they cannot be created.
        """
        self._opener.layout.prepare_runs()

    def sweep(self) -> int:
        """Remove what servers that died left in ``runs/`` (see :func:`.scratch.sweep_scratch`); return how many."""
        return sweep_scratch(self._opener.layout)

    # --- lifecycle --------------------------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def running(self, parked: ParkedStates | None = None) -> AsyncIterator[Engine]:
        """Run the engine's background work (session interpreters, warm sandboxes, reapers) for this block.

        ``parked``: where idle sessions are parked (``session_park_after``) and resumed from; None:
        sessions are never parked. On the way out every idle session is parked, then every session
        and warm sandbox is closed (bounded, shielded from cancellation), and the egress proxy's kept
        connections.

        Raises:
            RuntimeError: the engine is already running.
        """
        async with contextlib.AsyncExitStack() as stack:
            await stack.enter_async_context(self.backend.running())
            stack.push_async_callback(self._opener.close_egress)
            await stack.enter_async_context(self._ready.running())  # after the sessions (born of it) on the way out
            await stack.enter_async_context(self._sessions.running(parked))
            await stack.enter_async_context(self._pools.running())
            yield self

    @property
    def admission(self) -> Admission:
        """The run slots and their queue (for status and metrics)."""
        return self._admission

    @property
    def pool(self) -> WarmPool:
        """The warm sandboxes of ``sandbox_uid`` (for status and benchmarks)."""
        return self._pools.default.warm

    @property
    def ready(self) -> ReadyPool:
        """The session-ready sandboxes of ``sandbox_uid`` (for status and benchmarks)."""
        return self._ready.default

    @property
    def ready_pools(self) -> ReadyByUid:
        """The session-ready sandboxes of every host uid (for status, metrics and tests)."""
        return self._ready

    @property
    def prestart(self) -> PrestartPool:
        """The pre-started single-use sandboxes of ``sandbox_uid`` (for status and benchmarks)."""
        return self._pools.default.prestart

    @property
    def pools(self) -> PoolsByUid:
        """The warm and pre-started sandboxes of every host uid (for status, metrics and tests)."""
        return self._pools

    async def park_sessions(self) -> None:
        """Park every idle session now (see :meth:`.SessionManager.park_idle`); nothing where parking is off."""
        await self._sessions.park_idle()

    async def end_session(self, key: str) -> bool:
        """Stop session ``key``'s interpreter now (a run in it fails); False if it had none."""
        return await self._sessions.end(key)

    @contextlib.asynccontextmanager
    async def fork_source(
        self, key: str, budget: int | None, grow: Callable[[int], None] | None = None, *, tenant: str = "default"
    ) -> AsyncIterator[ForkState | str | None]:
        """Hold session ``key`` (``tenant``'s) between two runs (waiting for its running one; the
        caller bounds the wait) and yield its variables as a fork's state, or why they are not
        carried, or None where it has neither a live interpreter nor a parked state.

        A parked source's state is its file, checked (:mod:`.parking`), sent as it is: it is
        already counted in the source's bytes, which the caller reserved for the copy.

        ``budget``: the bytes of variables carried at most (larger ones are skipped, named);
        None: none are (the session is only held still while its files are copied). The state is
        spooled to a file as the source's sandbox writes it (:mod:`.fork_state`), each chunk
        reserved first with ``grow``; the caller owns the :class:`ForkState` yielded (closes it).

        Raises:
            QuotaExceededError: ``grow`` refused a chunk (a disk budget); nothing is left of it.
            OSError: the file for the state cannot be made.
            WorkspaceError: the source's parked state failed its integrity check (deleted).
        """
        async with self._sessions.holding(key) as interpreter:
            taken: ForkState | str | None = None
            if interpreter is None and budget is not None:
                taken = await self._sessions.parked_state(key, tenant)
            elif interpreter is not None and budget is not None:
                spool = Spool(self._opener.layout.prepare_runs(), budget, grow)
                try:
                    dumped = await interpreter.snapshot(budget, spool.feed)
                except BaseException:  # cut short mid-dump: the interpreter cannot serve its next run
                    spool.close()
                    await interpreter.kill()
                    raise
                taken = spool.taken(dumped)
            yield taken

    @contextlib.asynccontextmanager
    async def holding(self, key: str) -> AsyncIterator[Interpreter | None]:
        """Hold session ``key`` between two runs (its running one waited for; the caller bounds the
        wait) and yield its live interpreter, or None: what a checkpoint's restore replaces."""
        async with self._sessions.holding(key) as interpreter:
            yield interpreter

    def live_sessions(self) -> set[str]:
        """Keys of the sessions that exist now (their workspaces are in use)."""
        return self._sessions.live()

    def busy(self) -> set[str]:
        """Keys of the sessions with a run in progress or waiting."""
        return self._sessions.busy()

    # --- runs -------------------------------------------------------------------------------------

    def _shared(self, workspace: Path) -> bool:
        """Whether a run besides the asking one is using ``workspace`` now."""
        return self._using[workspace] > 1

    @contextlib.contextmanager
    def _use(self, workspace: Path | None) -> Iterator[None]:
        if workspace is None:
            yield
            return
        self._using[workspace] += 1
        try:
            yield
        finally:
            self._using[workspace] -= 1
            if not self._using[workspace]:
                del self._using[workspace]

    async def execute(self, request: ExecutionRequest, prepare: Prepare | None = None) -> ExecutionResult:
        """Run ``request`` and describe the outcome. Never raises for what the code did.

        ``prepare``: what must happen once the run is admitted, before it runs (a fork's copy: a
        call refused for capacity copies nothing); it returns the request to run, and what it
        raises is raised.

        Raises:
            SandboxStartError: the sandbox could not be started at all.
            BusyError: the server is at capacity (admission control), or the run needs a new
                session and every session is busy.
            RuntimeError: the run names a session but the engine is not running (see :meth:`running`).
            ValueError: a session (or warm) run's ``tools`` mount stubs elsewhere than ``/tools/<alias>``.
        """
        queued = time.perf_counter()
        async with contextlib.AsyncExitStack() as stack:
            await stack.enter_async_context(self._admission.slot(request.tenant))
            if prepare is not None:
                request = await prepare(request)
            # Told on the call's span where the run is awaited by its call, else a span of its own.
            with self._use(request.workspace), tracing.step("mcp_sandbox.placement") as span:
                started = time.perf_counter()
                self.events.emit(RunAdmitted(wait=started - queued))
                try:
                    result = await self._place(request, started)
                except BaseException:
                    if span is not None:
                        span.set_attributes(_placed(request, None))
                    raise
                if span is not None:
                    span.set_attributes(_placed(request, result))
                return result

    async def _place(self, request: ExecutionRequest, started: float) -> ExecutionResult:
        for path, placement in self._placements:
            if placement.accepts(request) and (result := await placement.run(request, started)) is not None:
                return dataclasses.replace(result, path="born" if result.born else path)
        return dataclasses.replace(await self._fresh.run(request, started), path="fresh")


def _placed(request: ExecutionRequest, result: ExecutionResult | None) -> dict[str, tracing.AttributeValue]:
    """What the run's span says of it (bounded values only): its language, whether it has network, and where
    it went: ``session`` (its live session's interpreter), ``resumed`` (a parked session's variables
    loaded first), ``born`` (a new session), ``forked`` (a fork's first run), ``warm``, ``prestarted``
    or ``fresh``; and how it ended (no ``result``: the placement raised)."""
    told: dict[str, tracing.AttributeValue] = {
        "mcp_sandbox.language": request.language,
        "mcp_sandbox.network": request.egress is not None,
    }
    if result is None:
        return told
    if result.session == "resumed":
        how = "resumed"
    elif request.fork_state is not None and result.session == "new":
        how = "forked"
    elif result.path == "session":
        how = "born" if result.session == "new" else "session"
    else:
        how = result.path
    told["mcp_sandbox.placement"] = how
    told["mcp_sandbox.run.status"] = result.status
    return told
