"""The engine: runs execution requests, in a warm sandbox, a fresh one or a session's, and says what happened.

Every run first takes a slot of the admission control (:mod:`.admission`). Then:

- a run without a conversation takes a warm sandbox from the pool (:mod:`.pool`) when one is
  idle: the sandbox's zygote forks a fresh interpreter for it and reports the child's exit
  code, and the run is judged like a fresh sandbox's (exit code, memory and pids counters of
  the sandbox's cgroup over the run);
- otherwise it runs in a fresh sandbox: an interpreter that serves one run and exits (judged
  by its process's exit code, memory and process counts, as a one-shot sandbox);
- a session run is one of many runs of a session's interpreter (judged by the exit code its
  DONE frame reports; if the interpreter dies, the session's state is gone and the next run
  starts a new one).

All of them go through one :class:`~mcp_sandbox.engine.interpreter.Interpreter`. Sessions and
the pool need an owner for their sandboxes: ``async with engine.running():``. A run with a
``session`` key outside it raises ``RuntimeError``; runs without one work either way (cold).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import signal
import time
import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import anyio
import anyio.to_thread

from mcp_sandbox.config import Settings
from mcp_sandbox.engine.admission import Admission
from mcp_sandbox.engine.interpreter import Exited, Interpreter, RunRecord, open_interpreter
from mcp_sandbox.engine.pool import Warm, WarmPool
from mcp_sandbox.engine.result import EXIT_TIMEOUT, ExecutionRequest, ExecutionResult, SessionState, Status
from mcp_sandbox.engine.runtimes import limits_for, policy_for, python_policy, zygote_policy
from mcp_sandbox.engine.sessions import Lease, SessionManager, ToolsView
from mcp_sandbox.errors import SandboxStartError
from mcp_sandbox.sandbox.backends import Backend, SandboxOutcome
from mcp_sandbox.sandbox.policy import Mount, SandboxPolicy
from mcp_sandbox.sandbox.seccomp import zygote_guard_bpf
from mcp_sandbox.workspace.removal import remove_tree

__all__ = ["Engine"]

logger = logging.getLogger(__name__)

_STATE_LOST = "the session's state is lost; the next run starts a fresh interpreter"
# How long a zygote that died during a run may take to be seen gone (for its outcome).
DEATH_SETTLE_SECONDS = 2.0


def _human_bytes(count: int) -> str:
    return f"{count / (1 << 20):g} MiB" if count >= 1 << 20 else f"{count} bytes"


def _tool_mounts(request: ExecutionRequest) -> tuple[Mount, ...]:
    return tuple(request.tools.mounts) if request.tools is not None else ()


def _elapsed_ms(started: float) -> int:
    return round((time.perf_counter() - started) * 1000)


async def _remove_shielded(directory: Path) -> None:
    with anyio.CancelScope(shield=True):
        try:
            await anyio.to_thread.run_sync(remove_tree, directory)
        except OSError as exc:
            logger.error("could not remove %s: %s", directory, exc)


class Engine:
    """Runs execution requests on a backend: one fresh sandbox per request, or a session's."""

    def __init__(self, settings: Settings, backend: Backend) -> None:
        self.settings = settings
        self.backend = backend
        self._runs_dir = settings.state_dir / "runs"
        self._sessions = SessionManager(settings, self._session_sandbox)
        self._pool = WarmPool(settings, self._warm_sandbox)
        self._admission = Admission(settings.max_concurrent_runs, settings.max_queued_runs, settings.queue_timeout)
        self._preload_reported = False

    def prepare(self) -> None:
        """Create the state directory layout (idempotent).

        The state directory is the server's own (0700 when it is not shared); the sandbox uid
        may only traverse into ``runs/`` to reach its own workspace.
        """
        self.settings.state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        self._runs_dir.mkdir(exist_ok=True, mode=0o711)
        os.chmod(self.settings.state_dir, 0o711)
        os.chmod(self._runs_dir, 0o711)

    def sweep(self) -> int:
        """Remove scratch workspaces (and session tool views) left by servers that died; return how many.

        Each scratch directory is named after the server's pid, so only a dead server's are
        touched, even when several servers share a state directory.
        """
        removed = 0
        for directory in self._runs_dir.iterdir():
            owner = directory.name.partition("-")[0]
            if owner.isdigit() and not Path(f"/proc/{owner}").exists():
                try:
                    remove_tree(directory)
                except OSError as exc:
                    logger.warning("could not remove the stale workspace %s: %s", directory, exc)
                    continue
                removed += 1
        return removed

    # --- lifecycle of sessions ------------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[Engine]:
        """Run the engine's background work (session interpreters, warm sandboxes, reapers) for this block.

        On the way out every session and warm sandbox is closed (bounded, shielded from cancellation).

        Raises:
            RuntimeError: the engine is already running.
        """
        async with contextlib.AsyncExitStack() as stack:
            await stack.enter_async_context(self._sessions.running())
            if self.backend.warm_pool:
                await stack.enter_async_context(self._pool.running())
            yield self

    @property
    def pool(self) -> WarmPool:
        """The warm sandboxes (for status and benchmarks)."""
        return self._pool

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
        async with self._admission.slot():
            started = time.perf_counter()
            # JavaScript keeps no session: each of its runs is a fresh sandbox (on the conversation's workspace).
            if request.session is not None and self.settings.sessions and request.language == "python":
                return await self._execute_in_session(request, request.session, started)
            if (
                request.workspace is None
                and request.language == "python"
                and self.backend.warm_pool
                and (warm := self._pool.take()) is not None
            ):
                return await self._execute_warm(request, warm, started)
            return await self._execute_fresh(request, started)

    @contextlib.asynccontextmanager
    async def _scratch_workspace(self) -> AsyncIterator[Path]:
        """A fresh workspace for one run (or session), owned by the sandbox's host uid, removed after."""
        self.prepare()
        directory = self._runs_dir / f"{os.getpid()}-{uuid.uuid4().hex}"
        directory.mkdir(mode=0o700)
        try:
            if os.geteuid() == 0:
                os.chown(directory, self.settings.sandbox_uid, self.settings.sandbox_gid)
            yield directory
        finally:
            # Off the event loop: a run may leave a million files behind.
            await _remove_shielded(directory)

    async def _execute_fresh(self, request: ExecutionRequest, started: float) -> ExecutionResult:
        record = RunRecord.capped(self.settings.max_output)
        interpreter: Interpreter | None = None
        async with contextlib.AsyncExitStack() as stack:
            workspace = request.workspace
            if workspace is None:
                workspace = await stack.enter_async_context(self._scratch_workspace())
            policy = policy_for(
                self.settings,
                request.language,
                workspace=workspace,
                timeout=request.timeout,
                mounts=request.tools.mounts if request.tools is not None else (),
            )
            with anyio.move_on_after(request.timeout) as deadline:
                async with open_interpreter(self.backend, policy, self.settings) as interpreter:
                    await self._run(interpreter, record, request, last=True)
        result = self._captured(record, interpreter, started)
        if deadline.cancelled_caught or interpreter is None or interpreter.outcome is None:
            return self._timed_out(result, request, "the sandbox and all its processes were killed")
        return self._judge_fresh(interpreter.outcome, record, result)

    async def _execute_warm(self, request: ExecutionRequest, warm: Warm, started: float) -> ExecutionResult:
        record = RunRecord.capped(self.settings.max_output)
        interpreter = warm.interpreter
        before = interpreter.sandbox.limit_events()
        after = before
        exited: Exited | None = None
        reusable = False
        try:
            with anyio.move_on_after(request.timeout) as deadline:
                await anyio.to_thread.run_sync(warm.tools.bind, _tool_mounts(request))
                interpreter.take_own_output()  # what came between runs is no run's
                exited = await interpreter.run_forked(
                    record,
                    code=request.code,
                    servers=request.tools.servers if request.tools is not None else (),
                    environment=request.environment,
                    tools=request.tools,
                    cpu_seconds=limits_for(self.settings, request.timeout).cpu_seconds,
                    guard=warm.guard,
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
        result = dataclasses.replace(self._captured(record, interpreter, started), warm=True)
        if deadline.cancelled_caught:
            return self._timed_out(result, request, "the sandbox and all its processes were killed")
        if exited is None:
            outcome = interpreter.outcome or SandboxOutcome(returncode=-1)
            error = self._death(outcome, record, session=False) or "the warm sandbox ended before reporting the run"
            return dataclasses.replace(result, status="error", exit_code=None, error=error)
        outcome = SandboxOutcome(
            returncode=exited.exit_code,
            memory_exceeded=after.memory > before.memory,
            pids_exhausted=after.pids > before.pids,
        )
        return self._judge_fresh(outcome, record, result)

    async def _execute_in_session(self, request: ExecutionRequest, key: str, started: float) -> ExecutionResult:
        record = RunRecord.capped(self.settings.max_output)
        lease: Lease | None = None
        with anyio.move_on_after(request.timeout) as deadline:
            async with self._sessions.lease(key, workspace=request.workspace, reset=request.reset) as lease:
                try:
                    await anyio.to_thread.run_sync(lease.tools.bind, _tool_mounts(request))
                    lease.interpreter.take_own_output()  # what came between runs is no run's
                    await self._run(lease.interpreter, record, request, last=False)
                finally:
                    if not record.done or record.protocol_error is not None:
                        # Cut short (timeout, cancelled), dead or confused: it cannot serve another run.
                        await lease.discard()
        if lease is None:  # the deadline passed while waiting for the session's previous run
            result = self._captured(record, None, started)
            return self._timed_out(
                result, request, "it was still waiting for the session's previous run to finish; nothing ran", None
            )
        state: SessionState = "new" if lease.new else "kept"
        result = dataclasses.replace(self._captured(record, lease.interpreter, started), session=state)
        if deadline.cancelled_caught:
            return self._timed_out(
                result, request, f"the session's interpreter and all its processes were killed: {_STATE_LOST}", state
            )
        return self._judge_session(lease, record, result)

    async def _run(self, interpreter: Interpreter, record: RunRecord, request: ExecutionRequest, *, last: bool) -> None:
        await interpreter.run(
            record,
            code=request.code,
            servers=request.tools.servers if request.tools is not None else (),
            environment=request.environment,
            tools=request.tools,
            last=last,
        )

    @contextlib.asynccontextmanager
    async def _session_sandbox(self, workspace: Path | None) -> AsyncIterator[tuple[Interpreter, ToolsView]]:
        """A session's sandbox: its workspace (a scratch one when None), its /tools view, its interpreter."""

        def policy(workspace: Path, mounts: tuple[Mount, ...]) -> SandboxPolicy:
            return python_policy(
                self.settings, workspace=workspace, timeout=self.settings.max_timeout, mounts=mounts, session=True
            )

        async with self._long_lived_sandbox(workspace, policy) as opened:
            yield opened

    @contextlib.asynccontextmanager
    async def _warm_sandbox(self) -> AsyncIterator[Warm]:
        """A warm sandbox for the pool: a scratch workspace, a /tools view and a zygote that is READY.

        Raises:
            SandboxStartError: it did not start, or its zygote cannot fork safely.
        """

        def policy(workspace: Path, mounts: tuple[Mount, ...]) -> SandboxPolicy:
            return zygote_policy(self.settings, workspace=workspace, mounts=mounts)

        async with self._long_lived_sandbox(None, policy) as (interpreter, tools):
            ready = interpreter.ready
            pid = ready.get("pid")
            if not ready.get("zygote") or ready.get("problem") or not isinstance(pid, int) or pid < 1:
                raise SandboxStartError(f"the warm sandbox cannot serve runs: {ready.get('problem', ready)}")
            if ready.get("failed") and not self._preload_reported:
                self._preload_reported = True
                logger.warning("pool_preload: these modules did not import in the sandbox: %s", ready["failed"])
            yield Warm(interpreter, tools, zygote_guard_bpf(pid))

    @contextlib.asynccontextmanager
    async def _long_lived_sandbox(
        self, workspace: Path | None, make_policy: Callable[[Path, tuple[Mount, ...]], SandboxPolicy]
    ) -> AsyncIterator[tuple[Interpreter, ToolsView]]:
        """A sandbox serving many runs: its workspace (a scratch one when None), its /tools view, its interpreter."""
        async with contextlib.AsyncExitStack() as stack:
            if workspace is None:
                workspace = await stack.enter_async_context(self._scratch_workspace())
            self.prepare()
            tools = ToolsView.create(self._runs_dir, self.settings.state_dir / "stubs")
            stack.push_async_callback(_remove_shielded, tools.directory)
            policy = make_policy(workspace, tools.mounts())
            interpreter = await stack.enter_async_context(open_interpreter(self.backend, policy, self.settings))
            yield interpreter, tools

    # --- judgement ------------------------------------------------------------------------------

    def _captured(self, record: RunRecord, interpreter: Interpreter | None, started: float) -> ExecutionResult:
        """The result as far as the output goes: the run's streams, then anything the process itself wrote."""
        own_out, own_err = interpreter.take_own_output() if interpreter is not None else ("", "")
        return ExecutionResult(
            status="error",
            exit_code=None,
            stdout=record.stdout.text() + own_out,
            stderr=record.stderr.text() + own_err,
            duration_ms=_elapsed_ms(started),
            truncated=record.stdout.truncated or record.stderr.truncated,
            images=tuple(record.images),
            images_dropped=record.images_dropped,
        )

    @staticmethod
    def _timed_out(
        result: ExecutionResult, request: ExecutionRequest, what: str, session: SessionState | None = None
    ) -> ExecutionResult:
        return dataclasses.replace(
            result,
            status="timeout",
            exit_code=EXIT_TIMEOUT,
            error=f"timed out after {request.timeout:g} s; {what}",
            session=session,
        )

    def _death(self, outcome: SandboxOutcome, record: RunRecord, *, session: bool) -> str | None:
        """Why an interpreter ended without reporting its run (None: it exited 0 without saying more)."""
        code = outcome.returncode
        if outcome.memory_exceeded:
            return f"memory limit of {_human_bytes(self.settings.memory)} exceeded"
        if code > 128 and code - 128 in signal.valid_signals():
            sig = signal.Signals(code - 128)
            if sig is signal.SIGXCPU:
                limit = self.settings.session_cpu_seconds if session else None
                counted = f"its CPU time limit of {limit} s, counted over all the session's runs" if limit else None
                return f"the interpreter was killed by SIGXCPU: it used up {counted or 'its CPU time limit'}"
            return f"the interpreter was killed by {sig.name}"
        if record.protocol_error is not None:
            return f"protocol error on the sandbox channel: {record.protocol_error}"
        if code != 0 or session:
            return f"the interpreter exited with {code} before reporting a result"
        return None

    def _judge_fresh(self, outcome: SandboxOutcome, record: RunRecord, captured: ExecutionResult) -> ExecutionResult:
        """Status, exit code and explanation of a fresh run that ended before its deadline.

        The process's exit code is the verdict (a DONE frame the code forged cannot change it).
        """
        code = outcome.returncode
        error: str | None = None
        if outcome.memory_exceeded or not record.done:
            error = self._death(outcome, record, session=False)
        if outcome.pids_exhausted:
            note = f"process limit of {self.settings.pids} reached"
            error = f"{error}; {note}" if error else note
        status: Status = "success" if code == 0 and error is None else "error"
        return dataclasses.replace(captured, status=status, exit_code=code, error=error)

    def _judge_session(self, lease: Lease, record: RunRecord, captured: ExecutionResult) -> ExecutionResult:
        """Status, exit code and explanation of a session run that ended before its deadline."""
        if record.done and record.protocol_error is None:
            reported = record.exit_code if record.exit_code is not None else 1
            status: Status = "success" if reported == 0 else "error"
            return dataclasses.replace(captured, status=status, exit_code=reported)
        outcome = lease.interpreter.outcome
        if lease.ended is not None:
            error = f"{lease.ended}; {_STATE_LOST}"
        elif outcome is None:  # pragma: no cover - discard() always records one
            error = f"the interpreter stopped; {_STATE_LOST}"
        else:
            death = self._death(outcome, record, session=True)
            error = f"{death}; {_STATE_LOST}"
        code = outcome.returncode if outcome is not None else None
        return dataclasses.replace(captured, status="error", exit_code=code, error=error)
