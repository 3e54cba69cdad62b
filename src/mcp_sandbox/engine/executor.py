"""The engine: runs execution requests, in a fresh sandbox each or in a session's, and says what happened.

Both kinds of run go through one :class:`~mcp_sandbox.engine.interpreter.Interpreter`: a fresh
run is an interpreter that serves one run and exits (judged by its process's exit code, memory
and process counts, as a one-shot sandbox); a session run is one of many runs of a session's
interpreter (judged by the exit code its DONE frame reports; if the interpreter dies, the
session's state is gone and the next run starts a new one).

Sessions need an owner for their interpreters and the idle reaper: ``async with
engine.running():``. A run with a ``session`` key outside it raises ``RuntimeError``; runs
without one work either way.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import signal
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import anyio
import anyio.to_thread

from mcp_sandbox.config import Settings
from mcp_sandbox.engine.interpreter import Interpreter, RunRecord, open_interpreter
from mcp_sandbox.engine.result import EXIT_TIMEOUT, ExecutionRequest, ExecutionResult, SessionState, Status
from mcp_sandbox.engine.runtimes import policy_for, python_policy
from mcp_sandbox.engine.sessions import Lease, SessionManager, ToolsView
from mcp_sandbox.sandbox.backends import Backend, SandboxOutcome
from mcp_sandbox.workspace.removal import remove_tree

__all__ = ["Engine"]

logger = logging.getLogger(__name__)

_STATE_LOST = "the session's state is lost; the next run starts a fresh interpreter"


def _human_bytes(count: int) -> str:
    return f"{count / (1 << 20):g} MiB" if count >= 1 << 20 else f"{count} bytes"


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
        """Run the engine's background work (session interpreters, the idle reaper) for this block.

        On the way out every session is closed (bounded, shielded from cancellation).

        Raises:
            RuntimeError: the engine is already running.
        """
        async with self._sessions.running():
            yield self

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
            BusyError: the run needs a new session and every session is busy.
            RuntimeError: the run names a session but the engine is not running (see :meth:`running`).
            ValueError: a session run's ``tools`` mount stubs elsewhere than ``/tools/<alias>``.
        """
        started = time.perf_counter()
        # JavaScript keeps no session: each of its runs is a fresh sandbox (on the conversation's workspace).
        if request.session is not None and self.settings.sessions and request.language == "python":
            return await self._execute_in_session(request, request.session, started)
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

    async def _execute_in_session(self, request: ExecutionRequest, key: str, started: float) -> ExecutionResult:
        record = RunRecord.capped(self.settings.max_output)
        lease: Lease | None = None
        with anyio.move_on_after(request.timeout) as deadline:
            async with self._sessions.lease(key, workspace=request.workspace, reset=request.reset) as lease:
                try:
                    await anyio.to_thread.run_sync(
                        lease.tools.bind, request.tools.mounts if request.tools is not None else ()
                    )
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
        async with contextlib.AsyncExitStack() as stack:
            if workspace is None:
                workspace = await stack.enter_async_context(self._scratch_workspace())
            self.prepare()
            tools = ToolsView.create(self._runs_dir, self.settings.state_dir / "stubs")
            stack.push_async_callback(_remove_shielded, tools.directory)
            policy = python_policy(
                self.settings,
                workspace=workspace,
                timeout=self.settings.max_timeout,
                mounts=tools.mounts(),
                session=True,
            )
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
