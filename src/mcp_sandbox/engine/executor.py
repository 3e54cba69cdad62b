"""The engine: runs execution requests, in a warm sandbox, a fresh one or a session's, and says what happened.

Every run first takes a slot of the admission control (:mod:`.admission`). Then:

- a run without a conversation takes a warm sandbox from the pool (:mod:`.warm`) when one is
  idle: the sandbox's zygote forks a fresh interpreter for it and reports the child's exit
  code, and the run is judged like a fresh sandbox's (exit code, memory and pids counters of
  the sandbox's cgroup over the run);
- a run that cannot fork from a zygote (JavaScript; Python on a container backend) takes a
  pre-started single-use sandbox when one is ready and the run is :func:`.prestart.eligible`:
  it serves this one run like a fresh sandbox and is destroyed (see :mod:`.prestart`); a
  Python one's zygote forks the run's child and reports its exit, as a warm sandbox's does;
- otherwise it runs in a fresh sandbox: an interpreter that serves one run and exits (judged
  by its process's exit code, memory and process counts, as a one-shot sandbox);
- a session run is one of many runs of a session's interpreter (judged by the exit code its
  DONE frame reports; if the interpreter dies, the session's state is gone and the next run
  starts a new one).

A run granted network (``request.egress``) never takes a warm sandbox: it runs in a fresh one,
or in its session's. Its proxy (:mod:`mcp_sandbox.egress`) lives exactly as long as the run: a
session's sandbox (started able to hold a relay where the deployment allows network at all) has
the proxy's socket only during its runs that were granted network, and only those runs get the
proxy variables.

All of them go through one :class:`~mcp_sandbox.engine.interpreter.Interpreter`. Sessions and
the pool need an owner for their sandboxes: ``async with engine.running():``. A run with a
``session`` key outside it raises ``RuntimeError``; runs without one work either way (cold).

This module runs things: :mod:`.verdict` puts how a run went into words, :mod:`.scratch` gives a
run without a conversation its workspace where the backend cannot size one itself (bwrap gives it
a tmpfs), :mod:`.disk` stops a run that writes past its workspace's quota, and
:mod:`mcp_sandbox.state` says where things live.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import anyio
import anyio.to_thread

from mcp_sandbox.config import Settings
from mcp_sandbox.egress import (
    AuditLog,
    Resolver,
    TenantEgress,
    sandbox_environment,
    serve_egress,
    socket_directory,
    system_resolver,
)
from mcp_sandbox.engine.admission import Admission
from mcp_sandbox.engine.disk import DiskBound, Overrun, disk_bound
from mcp_sandbox.engine.interpreter import Exited, Interpreter, RunRecord, open_interpreter
from mcp_sandbox.engine.prestart import Prestarted, PrestartPool, eligible
from mcp_sandbox.engine.result import ExecutionRequest, ExecutionResult, SessionState
from mcp_sandbox.engine.runtimes import (
    limits_for,
    policy_for,
    python_policy,
    with_egress,
    with_file_size,
    zygote_policy,
)
from mcp_sandbox.engine.scratch import remove_shielded, scratch_workspace, sweep_scratch
from mcp_sandbox.engine.sessions import Lease, SessionManager, ToolsView
from mcp_sandbox.engine.verdict import (
    STATE_LOST,
    captured,
    death,
    explain_file_size,
    judge_fresh,
    judge_session,
    stopped_for_disk,
    timed_out,
)
from mcp_sandbox.engine.warm import Warm, WarmPool
from mcp_sandbox.engine.warm import eligible as warm_eligible
from mcp_sandbox.errors import ConfigError, SandboxStartError
from mcp_sandbox.events import EventHub, RunAdmitted
from mcp_sandbox.sandbox.backends import Backend, SandboxOutcome
from mcp_sandbox.sandbox.policy import Mount, SandboxPolicy
from mcp_sandbox.sandbox.seccomp import zygote_guard_bpf
from mcp_sandbox.state import StateLayout

__all__ = ["Engine"]

logger = logging.getLogger(__name__)

# How long a zygote that died during a run may take to be seen gone (for its outcome).
DEATH_SETTLE_SECONDS = 2.0


def _remove_directory(path: Path) -> None:
    with contextlib.suppress(OSError):
        path.rmdir()


def _tool_mounts(request: ExecutionRequest) -> tuple[Mount, ...]:
    return tuple(request.tools.mounts) if request.tools is not None else ()


class Engine:
    """Runs execution requests on a backend: one fresh sandbox per request, or a session's."""

    def __init__(
        self,
        settings: Settings,
        backend: Backend,
        events: EventHub | None = None,
        *,
        egress_resolver: Resolver = system_resolver,
    ) -> None:
        """``egress_resolver``: how the egress proxy resolves names (tests give a table of their own hosts)."""
        self.settings = settings
        self.backend = backend
        self.events = events if events is not None else EventHub()
        self._layout = StateLayout.of(settings)
        self._sessions = SessionManager(settings, self._session_sandbox)
        self._pool = WarmPool(settings, self._warm_sandbox)
        self._prestart = PrestartPool(settings, self._prestarted_sandbox)
        self._admission = Admission(
            settings.max_concurrent_runs,
            settings.max_queued_runs,
            settings.queue_timeout,
            tenant_limit=settings.tenant_concurrent_runs,
            tenant_queue=settings.tenant_queued_runs,
        )
        self._preload_reported = False
        self._egress_resolver = egress_resolver
        self._audit: AuditLog | None = None
        try:
            # Sessions' sandboxes can hold a relay only where some tenant may be granted network.
            self._session_egress = TenantEgress(settings).anywhere()
        except ConfigError:
            self._session_egress = False  # the server refuses to start with these settings anyway
        self._session_sockets: dict[int, Path] = {}  # id(interpreter) -> its proxy socket's directory

    def prepare(self) -> None:
        """Create the directories runs need under the state directory (idempotent; see :mod:`mcp_sandbox.state`).

        Raises:
            OSError: they cannot be created.
        """
        self._layout.prepare_runs()

    def sweep(self) -> int:
        """Remove what servers that died left in ``runs/`` (see :func:`.scratch.sweep_scratch`); return how many."""
        return sweep_scratch(self._layout)

    # --- lifecycle of sessions ------------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[Engine]:
        """Run the engine's background work (session interpreters, warm sandboxes, reapers) for this block.

        On the way out every session and warm sandbox is closed (bounded, shielded from cancellation).

        Raises:
            RuntimeError: the engine is already running.
        """
        async with contextlib.AsyncExitStack() as stack:
            await stack.enter_async_context(self.backend.running())
            await stack.enter_async_context(self._sessions.running())
            if self.backend.warm_pool:
                await stack.enter_async_context(self._pool.running())
            await stack.enter_async_context(self._prestart.running())
            yield self

    @property
    def admission(self) -> Admission:
        """The run slots and their queue (for status and metrics)."""
        return self._admission

    @property
    def pool(self) -> WarmPool:
        """The warm sandboxes (for status and benchmarks)."""
        return self._pool

    @property
    def prestart(self) -> PrestartPool:
        """The pre-started single-use sandboxes (for status and benchmarks)."""
        return self._prestart

    async def end_session(self, key: str) -> bool:
        """Stop session ``key``'s interpreter now (a run in it fails); False if it had none."""
        return await self._sessions.end(key)

    def live_sessions(self) -> set[str]:
        """Keys of the sessions that exist now (their workspaces are in use)."""
        return self._sessions.live()

    def busy(self) -> set[str]:
        """Keys of the sessions with a run in progress or waiting."""
        return self._sessions.busy()

    # --- runs -----------------------------------------------------------------------------------

    async def execute(self, request: ExecutionRequest) -> ExecutionResult:
        """Run ``request`` and describe the outcome. Never raises for what the code did.

        Raises:
            SandboxStartError: the sandbox could not be started at all.
            BusyError: the server is at capacity (admission control), or the run needs a new
                session and every session is busy.
            RuntimeError: the run names a session but the engine is not running (see :meth:`running`).
            ValueError: a session (or warm) run's ``tools`` mount stubs elsewhere than ``/tools/<alias>``.
        """
        queued = time.perf_counter()
        async with self._admission.slot(request.tenant):
            started = time.perf_counter()
            self.events.emit(RunAdmitted(wait=started - queued))
            # JavaScript keeps no session: each of its runs is a fresh sandbox (on the conversation's workspace).
            if request.session is not None and self.settings.sessions and request.language == "python":
                if request.egress is None or self._session_egress:
                    return await self._execute_in_session(request, request.session, started)
            if request.egress is not None:  # never a warm sandbox
                return await self._execute_fresh(request, started)
            if (
                self.backend.warm_pool
                and warm_eligible(request)
                and (warm := await self._pool.take(preloaded=self._pool.needs_preload(request.code))) is not None
            ):
                return await self._execute_warm(request, warm, started)
            if (
                (request.language != "python" or not self.backend.warm_pool)
                and eligible(self.settings, request)
                and (sandbox := await self._prestart.take(request.language)) is not None
            ):
                return await self._execute_prestarted(request, sandbox, started)
            return await self._execute_fresh(request, started)

    async def _execute_fresh(self, request: ExecutionRequest, started: float) -> ExecutionResult:
        record = RunRecord.capped(self.settings.max_output, request.on_output)
        interpreter: Interpreter | None = None
        async with contextlib.AsyncExitStack() as stack:
            workspace = request.workspace
            bound = DiskBound.conversation(self.settings)
            if workspace is None and not self.backend.sized_scratch:
                workspace = await stack.enter_async_context(scratch_workspace(self.settings))
                bound = DiskBound.scratch(self.settings)
            policy = policy_for(
                self.settings,
                request.language,
                workspace=workspace,
                timeout=request.timeout,
                mounts=request.tools.mounts if request.tools is not None else (),
            )
            if request.egress is not None:
                directory = await stack.enter_async_context(self._serve_egress(request, None))
                policy = with_egress(policy, directory)
            overrun = Overrun(bound)
            with anyio.move_on_after(request.timeout) as deadline:
                async with disk_bound(workspace, bound) as overrun:
                    file_size = overrun.file_size(self.settings.max_file_size)
                    async with open_interpreter(self.backend, with_file_size(policy, file_size), self.settings) as (
                        interpreter
                    ):
                        await self._run(interpreter, record, request, last=True)
        result = captured(record, interpreter, started)
        if overrun.reason is not None:
            return stopped_for_disk(result, overrun.reason, stopped=overrun.stopped)
        if deadline.cancelled_caught or interpreter is None or interpreter.outcome is None:
            return timed_out(result, request, "the sandbox and all its processes were killed")
        judged = judge_fresh(self.settings, interpreter.outcome, record, result)
        return explain_file_size(self.settings, overrun, judged)

    async def _execute_warm(self, request: ExecutionRequest, warm: Warm, started: float) -> ExecutionResult:
        """Run in ``warm``: answered on the zygote's EXITED; the restore after it is the pool's, off this path."""
        record = RunRecord.capped(self.settings.max_output, request.on_output)
        interpreter = warm.interpreter
        scratch = Overrun(DiskBound.scratch(self.settings))  # a wiped scratch workspace: all of it is left
        before = warm.limits
        after = before
        exited: Exited | None = None
        reusable = False
        try:
            with anyio.move_on_after(request.timeout) as deadline:
                await warm.tools.show(_tool_mounts(request))
                interpreter.take_own_output()  # what came between runs is no run's
                exited = await self._run_forked(
                    interpreter, record, request, warm.guard, scratch.file_size(self.settings.max_file_size)
                )
                after = interpreter.sandbox.limit_events()
            reusable = exited is not None and exited.problem is None and not deadline.cancelled_caught
            if exited is not None and exited.problem is not None:
                logger.info("a warm sandbox is replaced: %s", exited.problem)
        finally:
            if not reusable:
                if exited is None and not deadline.cancelled_caught:
                    with anyio.move_on_after(DEATH_SETTLE_SECONDS):  # the zygote died: let its outcome be known
                        await interpreter.exited.wait()
                await interpreter.kill()
            self._pool.give_back(warm, reusable=reusable)
        result = dataclasses.replace(captured(record, interpreter, started), warm=True)
        if deadline.cancelled_caught:
            return timed_out(result, request, "the sandbox and all its processes were killed")
        if exited is None:
            outcome = interpreter.outcome or SandboxOutcome(returncode=-1)
            error = (
                death(self.settings, outcome, record, session=False)
                or "the warm sandbox ended before reporting the run"
            )
            return dataclasses.replace(result, status="error", exit_code=None, error=error)
        outcome = SandboxOutcome(
            returncode=exited.exit_code,
            memory_exceeded=after.memory > before.memory,
            pids_exhausted=after.pids > before.pids,
        )
        return explain_file_size(self.settings, scratch, judge_fresh(self.settings, outcome, record, result))

    async def _execute_prestarted(
        self, request: ExecutionRequest, sandbox: Prestarted, started: float
    ) -> ExecutionResult:
        """Run in a pre-started sandbox, judged as a fresh one; it serves this run only, then its owner destroys it.

        With a zygote (Python) the run is its forked child's, judged by the zygote's EXITED and
        the sandbox's counters then (they are this run's alone), and answered before the
        sandbox is torn down.
        """
        record = RunRecord.capped(self.settings.max_output, request.on_output)
        interpreter = sandbox.interpreter
        overrun = Overrun(DiskBound.scratch(self.settings))
        outcome: SandboxOutcome | None = None
        try:
            with anyio.move_on_after(request.timeout) as deadline:
                async with disk_bound(sandbox.workspace, overrun.bound) as overrun:
                    await sandbox.tools.show(_tool_mounts(request))
                    interpreter.take_own_output()  # what it said while it waited is no run's
                    file_size = overrun.file_size(self.settings.max_file_size)
                    if sandbox.guard is None:  # answered once the runner has ended, before the teardown
                        ended = await self._run(
                            interpreter, record, request, last=True, file_size=file_size, early=True
                        )
                        outcome = ended or interpreter.outcome
                    else:
                        outcome = await self._run_forked_once(interpreter, record, request, sandbox.guard, file_size)
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
            return dataclasses.replace(
                result, status="error", exit_code=None, error="the pre-started sandbox ended before reporting the run"
            )
        return explain_file_size(self.settings, overrun, judge_fresh(self.settings, outcome, record, result))

    async def _run_forked_once(
        self,
        interpreter: Interpreter,
        record: RunRecord,
        request: ExecutionRequest,
        guard: bytes,
        file_size: int,
    ) -> SandboxOutcome | None:
        """Run in the child a single-use sandbox's zygote forked; how it ended (None: not known).

        The sandbox serves no other run, so its counters now are this run's.
        """
        exited = await self._run_forked(interpreter, record, request, guard, file_size)
        if exited is not None:
            return interpreter.sandbox.judge(exited.exit_code)
        with anyio.move_on_after(DEATH_SETTLE_SECONDS):  # the zygote died: let its outcome be known
            await interpreter.exited.wait()
        return interpreter.outcome

    async def _run_forked(
        self, interpreter: Interpreter, record: RunRecord, request: ExecutionRequest, guard: bytes, file_size: int
    ) -> Exited | None:
        """``request`` in a child ``interpreter``'s zygote forks for it (see :meth:`Interpreter.run_forked`)."""
        return await interpreter.run_forked(
            record,
            code=request.code,
            servers=request.tools.servers if request.tools is not None else (),
            environment=request.environment,
            tools=request.tools,
            cpu_seconds=limits_for(self.settings, request.timeout).cpu_seconds,
            guard=guard,
            file_size=file_size,
        )

    async def _execute_in_session(self, request: ExecutionRequest, key: str, started: float) -> ExecutionResult:
        record = RunRecord.capped(self.settings.max_output, request.on_output)
        lease: Lease | None = None
        overrun = Overrun(DiskBound.conversation(self.settings))
        with anyio.move_on_after(request.timeout) as deadline:
            async with (
                disk_bound(request.workspace, overrun.bound) as overrun,
                self._sessions.lease(
                    key, workspace=request.workspace, reset=request.reset, tenant=request.tenant
                ) as lease,
            ):
                try:
                    await lease.tools.show(_tool_mounts(request))
                    lease.interpreter.take_own_output()  # what came between runs is no run's
                    async with contextlib.AsyncExitStack() as network:
                        run = request
                        if request.egress is not None:
                            sockets = self._session_sockets[id(lease.interpreter)]
                            await network.enter_async_context(self._serve_egress(request, sockets))
                            environment = {**sandbox_environment(request.language), **request.environment}
                            run = dataclasses.replace(request, environment=environment)
                        file_size = overrun.file_size(self.settings.max_file_size) if request.workspace else None
                        await self._run(lease.interpreter, record, run, last=False, file_size=file_size)
                finally:
                    if not record.done or record.protocol_error is not None:
                        # Cut short (timeout, cancelled), dead or confused: it cannot serve another run.
                        await lease.discard()
        if lease is None:  # the deadline passed while waiting for the session's previous run
            result = captured(record, None, started)
            return timed_out(
                result, request, "it was still waiting for the session's previous run to finish; nothing ran", None
            )
        state: SessionState = "new" if lease.new else "kept"
        result = dataclasses.replace(captured(record, lease.interpreter, started), session=state)
        if overrun.reason is not None and overrun.stopped:
            return stopped_for_disk(result, f"{overrun.reason}; {STATE_LOST}", state)
        if deadline.cancelled_caught:
            return timed_out(
                result, request, f"the session's interpreter and all its processes were killed: {STATE_LOST}", state
            )
        judged = judge_session(self.settings, record, result, outcome=lease.interpreter.outcome, ended=lease.ended)
        if overrun.reason is not None:
            return stopped_for_disk(judged, overrun.reason, state, stopped=False)
        return explain_file_size(self.settings, overrun, judged)

    async def _run(
        self,
        interpreter: Interpreter,
        record: RunRecord,
        request: ExecutionRequest,
        *,
        last: bool,
        file_size: int | None = None,
        early: bool = False,
    ) -> SandboxOutcome | None:
        return await interpreter.run(
            record,
            code=request.code,
            servers=request.tools.servers if request.tools is not None else (),
            environment=request.environment,
            tools=request.tools,
            last=last,
            file_size=file_size,
            early=early,
        )

    def _sandbox_group(self) -> int | None:
        """The host gid given the proxy's socket: the sandbox's when the server runs as root, else None."""
        return self.settings.sandbox_gid if os.geteuid() == 0 else None

    @contextlib.asynccontextmanager
    async def _serve_egress(self, request: ExecutionRequest, directory: Path | None) -> AsyncIterator[Path]:
        """The run's egress proxy for this block (in ``directory``, else a new one); yield the socket's directory."""
        assert request.egress is not None
        if self._audit is None:
            self._audit = AuditLog.open(self._layout.egress_log)
        served = serve_egress(
            self._layout.prepare_runs(),
            request.egress,
            self._audit,
            resolver=self._egress_resolver,
            group=self._sandbox_group(),
            directory=directory,
        )
        async with served as (_proxy, used):
            yield used

    @contextlib.asynccontextmanager
    async def _session_sandbox(self, workspace: Path | None) -> AsyncIterator[tuple[Interpreter, ToolsView]]:
        """A session's sandbox: its workspace (a scratch one when None), its /tools view, its interpreter.

        Where network may be granted, it holds the relay and an (empty) directory for the proxy's
        socket for life; the socket itself exists only during its runs granted network.
        """
        async with contextlib.AsyncExitStack() as stack:
            sockets: Path | None = None
            if self._session_egress:
                sockets = socket_directory(self._layout.prepare_runs(), self._sandbox_group())
                stack.callback(_remove_directory, sockets)

            def policy(workspace: Path | None, mounts: tuple[Mount, ...]) -> SandboxPolicy:
                made = python_policy(
                    self.settings, workspace=workspace, timeout=self.settings.max_timeout, mounts=mounts, session=True
                )
                if workspace is not None:  # no file of its may outgrow the quota (each run lowers its own limit)
                    made = with_file_size(made, min(made.limits.file_size, self.settings.quota_bytes))
                return made if sockets is None else with_egress(made, sockets, for_life=False)

            interpreter, tools, _ = await stack.enter_async_context(self._long_lived_sandbox(workspace, policy))
            if sockets is not None:
                self._session_sockets[id(interpreter)] = sockets
                stack.callback(self._session_sockets.pop, id(interpreter), None)
            yield interpreter, tools

    @contextlib.asynccontextmanager
    async def _prestarted_sandbox(self, language: str) -> AsyncIterator[Prestarted]:
        """A pre-started sandbox for ``language``: as a fresh run's, with a /tools view; READY, waiting for EXEC.

        Raises:
            SandboxStartError: it did not start.
        """

        zygote = language == "python"

        def policy(workspace: Path | None, mounts: tuple[Mount, ...]) -> SandboxPolicy:
            if zygote:  # nothing preloaded: a single-use sandbox would pay for it on every run
                return zygote_policy(self.settings, workspace=workspace, mounts=mounts, preload=())
            return policy_for(
                self.settings, language, workspace=workspace, timeout=self.settings.timeout, mounts=mounts
            )

        async with self._long_lived_sandbox(None, policy) as (interpreter, tools, workspace):
            guard = self._zygote_guard(interpreter) if zygote else None
            if not zygote:
                interpreter.sandbox.watch_runner()  # READY: no code has run in it yet
            yield Prestarted(language, interpreter, tools, workspace, guard)

    @contextlib.asynccontextmanager
    async def _warm_sandbox(self, preloaded: bool) -> AsyncIterator[Warm]:
        """A warm sandbox for the pool: a scratch workspace, a /tools view and a zygote that is READY.

        Its zygote imports ``pool_preload`` if ``preloaded``, else nothing (a light sandbox).

        Raises:
            SandboxStartError: it did not start, or its zygote cannot fork safely.
        """

        def policy(workspace: Path | None, mounts: tuple[Mount, ...]) -> SandboxPolicy:
            return zygote_policy(self.settings, workspace=workspace, mounts=mounts, preload=None if preloaded else ())

        async with self._long_lived_sandbox(None, policy) as (interpreter, tools, _):
            guard = self._zygote_guard(interpreter)
            if interpreter.ready.get("failed") and not self._preload_reported:
                self._preload_reported = True
                logger.warning(
                    "pool_preload: these modules did not import in the sandbox: %s", interpreter.ready["failed"]
                )
            yield Warm(interpreter, tools, guard, preloaded=preloaded)

    @staticmethod
    def _zygote_guard(interpreter: Interpreter) -> bytes:
        """The seccomp guard of the runs of ``interpreter``'s zygote (see :func:`zygote_guard_bpf`).

        Raises:
            SandboxStartError: the zygote cannot serve runs (it says why in its READY).
        """
        ready = interpreter.ready
        pid = ready.get("pid")
        if not ready.get("zygote") or ready.get("problem") or not isinstance(pid, int) or pid < 1:
            raise SandboxStartError(f"the warm sandbox cannot serve runs: {ready.get('problem', ready)}")
        return zygote_guard_bpf(pid)

    @contextlib.asynccontextmanager
    async def _long_lived_sandbox(
        self, workspace: Path | None, make_policy: Callable[[Path | None, tuple[Mount, ...]], SandboxPolicy]
    ) -> AsyncIterator[tuple[Interpreter, ToolsView, Path | None]]:
        """A sandbox with a /tools view: its interpreter, that view, its workspace (a scratch one when None).

        The workspace is None when the backend gives the sandbox a sized scratch space of its own.
        """
        async with contextlib.AsyncExitStack() as stack:
            if workspace is None and not self.backend.sized_scratch:
                workspace = await stack.enter_async_context(scratch_workspace(self.settings))
            self.prepare()
            tools = ToolsView.create(self._layout)
            stack.push_async_callback(remove_shielded, tools.directory)
            policy = make_policy(workspace, tools.mounts())
            interpreter = await stack.enter_async_context(open_interpreter(self.backend, policy, self.settings))
            yield interpreter, tools, workspace
