"""The engine: runs one execution request in a fresh sandbox and says what happened."""

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
from typing import Any

import anyio
import anyio.to_thread
from anyio.abc import TaskGroup

from mcp_sandbox.config import Settings
from mcp_sandbox.engine.channel import Channel, Kind
from mcp_sandbox.engine.output import CappedOutput
from mcp_sandbox.engine.result import EXIT_TIMEOUT, ExecutionRequest, ExecutionResult, Status, ToolAccess
from mcp_sandbox.engine.runtimes import python_policy
from mcp_sandbox.errors import ChannelError, SandboxStartError
from mcp_sandbox.sandbox.backends import Backend, Sandbox, SandboxOutcome
from mcp_sandbox.workspace import remove_tree

__all__ = ["Engine"]

logger = logging.getLogger(__name__)

_MAX_FRAME = 64 << 20


def _human_bytes(count: int) -> str:
    return f"{count / (1 << 20):g} MiB" if count >= 1 << 20 else f"{count} bytes"


class Engine:
    """Runs execution requests on a backend, one fresh sandbox per request."""

    def __init__(self, settings: Settings, backend: Backend) -> None:
        self.settings = settings
        self.backend = backend
        self._runs_dir = settings.state_dir / "runs"

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
        """Remove scratch workspaces left by servers that died mid-run; return how many.

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

    @contextlib.asynccontextmanager
    async def _scratch_workspace(self) -> AsyncIterator[Path]:
        """A fresh workspace for one run, owned by the sandbox's host uid, removed after."""
        self.prepare()
        directory = self._runs_dir / f"{os.getpid()}-{uuid.uuid4().hex}"
        directory.mkdir(mode=0o700)
        try:
            if os.geteuid() == 0:
                os.chown(directory, self.settings.sandbox_uid, self.settings.sandbox_gid)
            yield directory
        finally:
            # Off the event loop: a run may leave a million files behind.
            with anyio.CancelScope(shield=True):
                try:
                    await anyio.to_thread.run_sync(remove_tree, directory)
                except OSError as exc:
                    logger.error("could not remove the scratch workspace %s: %s", directory, exc)

    async def execute(self, request: ExecutionRequest) -> ExecutionResult:
        """Run ``request`` and describe the outcome. Never raises for what the code did.

        Raises:
            SandboxStartError: the sandbox could not be started at all.
        """
        started = time.perf_counter()
        async with contextlib.AsyncExitStack() as stack:
            workspace = request.workspace
            if workspace is None:
                workspace = await stack.enter_async_context(self._scratch_workspace())
            policy = python_policy(
                self.settings,
                workspace=workspace,
                timeout=request.timeout,
                environment=request.environment,
                mounts=request.tools.mounts if request.tools is not None else (),
            )
            sandbox = await self.backend.start(policy)
            try:
                return await self._supervise(sandbox, request, started)
            finally:
                await sandbox.aclose()
        raise AssertionError("unreachable")  # pragma: no cover - ExitStack does not swallow

    async def _supervise(self, sandbox: Sandbox, request: ExecutionRequest, started: float) -> ExecutionResult:
        stdout = CappedOutput(self.settings.max_output)
        stderr = CappedOutput(self.settings.max_output)
        talk = _Conversation()
        outcome: SandboxOutcome | None = None
        with anyio.move_on_after(request.timeout) as deadline:
            async with anyio.create_task_group() as group:
                group.start_soon(stdout.pump, sandbox.stdout)
                group.start_soon(stderr.pump, sandbox.stderr)
                await self._converse(sandbox, request, talk)
            outcome = await sandbox.wait()
        if outcome is None:
            outcome = await sandbox.aclose()
        result = ExecutionResult(
            status="timeout",
            exit_code=EXIT_TIMEOUT,
            stdout=stdout.text(),
            stderr=stderr.text(),
            duration_ms=round((time.perf_counter() - started) * 1000),
            truncated=stdout.truncated or stderr.truncated,
            error=f"timed out after {request.timeout:g} s; the sandbox and all its processes were killed",
        )
        return result if deadline.cancelled_caught else self._judge(outcome, talk, result)

    async def _converse(self, sandbox: Sandbox, request: ExecutionRequest, talk: _Conversation) -> None:
        """Send the code, then serve the sandbox's frames until DONE or the channel closes."""
        channel = await Channel.open(sandbox.channel, _MAX_FRAME)
        try:
            frame = await channel.receive()
            if frame is None or frame[0] is not Kind.READY:
                return
            talk.ready = True
            servers = list(request.tools.servers) if request.tools is not None else []
            await channel.send(Kind.EXEC, {"code": request.code, "servers": servers})
            # Tool calls are answered concurrently; those still running when the code is done
            # are abandoned with it.
            async with anyio.create_task_group() as calls:
                try:
                    await self._serve(channel, request.tools, talk, calls)
                finally:
                    calls.cancel_scope.cancel()
        except ChannelError as exc:
            # Sandboxed code can write garbage on its own channel: that ends the run, not the host.
            talk.protocol_error = str(exc)
        finally:
            channel.close()

    async def _serve(self, channel: Channel, tools: ToolAccess | None, talk: _Conversation, calls: TaskGroup) -> None:
        """Serve the sandbox's frames until DONE, ERROR or the end of the channel."""
        try:
            while (frame := await channel.receive()) is not None:
                kind, body = frame
                if kind is Kind.DONE:
                    talk.done = True
                    return
                if kind is Kind.ERROR:
                    talk.protocol_error = str(body.get("message", "unknown"))
                    return
                if kind is Kind.CALL:
                    calls.start_soon(self._answer, channel, tools, body)
                    continue
                await channel.send(Kind.ERROR, {"message": f"unexpected frame {kind.name} from the sandbox"})
        except ChannelError as exc:
            # Sandboxed code can write garbage on its own channel: that ends the run, not the host.
            talk.protocol_error = str(exc)

    @staticmethod
    async def _answer(channel: Channel, tools: ToolAccess | None, body: dict[str, Any]) -> None:
        """Answer one CALL frame with a REPLY carrying the same id."""
        call_id = body.get("id")
        if not isinstance(call_id, int) or isinstance(call_id, bool):
            await channel.send(Kind.ERROR, {"message": "a CALL frame needs an integer id"})
            return
        if tools is None:
            reply: dict[str, Any] = {
                "ok": False,
                "error": {"kind": "denied", "message": "this run may not call any MCP server: pass `servers`"},
            }
        else:
            try:
                reply = await tools.handle(body)
            except Exception as exc:  # a bug in one request must not end the run, let alone the server
                logger.exception("answering a request from the sandbox failed")
                reply = {"ok": False, "error": {"kind": "unavailable", "message": f"internal error: {exc}"}}
        try:
            await channel.send(Kind.REPLY, {**reply, "id": call_id})
        except ChannelError:
            pass  # the sandbox is gone; the run's outcome says why

    def _judge(self, outcome: SandboxOutcome, talk: _Conversation, captured: ExecutionResult) -> ExecutionResult:
        """Status, exit code and explanation of a run that ended before its deadline."""
        code = outcome.returncode
        if not talk.ready:
            raise SandboxStartError(f"the sandbox did not start (exit {code}): {captured.stderr.strip()[-2000:]}")
        error: str | None = None
        if outcome.memory_exceeded:
            error = f"memory limit of {_human_bytes(self.settings.memory)} exceeded"
        elif not talk.done:
            if code > 128 and code - 128 in signal.valid_signals():
                error = f"the interpreter was killed by {signal.Signals(code - 128).name}"
            elif talk.protocol_error is not None:
                error = f"protocol error on the sandbox channel: {talk.protocol_error}"
            elif code != 0:
                error = f"the interpreter exited with {code} before reporting a result"
        if outcome.pids_exhausted:
            note = f"process limit of {self.settings.pids} reached"
            error = f"{error}; {note}" if error else note
        status: Status = "success" if code == 0 and error is None else "error"
        return dataclasses.replace(captured, status=status, exit_code=code, error=error)


@dataclasses.dataclass
class _Conversation:
    """What the sandbox said on its channel during one run."""

    ready: bool = False
    done: bool = False
    protocol_error: str | None = None
