"""A live interpreter: a sandbox running the in-sandbox runner, serving runs one at a time.

A fresh run is an interpreter that serves one run (its EXEC frame says ``last``) and exits; a
session keeps one interpreter for many runs. Either way each run gets its own stdout/stderr
pipes (:func:`.output.run_pipes`), passed to the runner with the EXEC frame, so the host sees
the end of a run's output when the run is over (or, when code left a background process
holding the pipes, stops reading a short while after DONE). The process's own stdout/stderr carry only
the runtime's own failures (bootstrap errors, a crash trace written outside a run).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import functools
import itertools
import socket
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence

import anyio

from mcp_sandbox.egress import grant_environment
from mcp_sandbox.engine.channel import Channel
from mcp_sandbox.engine.fork_state import ForkState
from mcp_sandbox.engine.output import CappedOutput, pump_stream, run_pipes
from mcp_sandbox.engine.result import ExecutionRequest
from mcp_sandbox.engine.run_frames import RunCaps, RunRecord, serve_run
from mcp_sandbox.errors import ChannelError, SandboxStartError
from mcp_sandbox.protocol import HEADER, Exec, Exited, Kind, Ready, Verdict
from mcp_sandbox.sandbox.backends import Backend, LimitEvents, Sandbox, SandboxOutcome
from mcp_sandbox.sandbox.policy import SandboxPolicy

# Exited: how a zygote's child ended (its EXITED frame), as run_forked() returns it.
__all__ = ["Exited", "Interpreter", "frame_limits", "open_interpreter"]

_MAX_FRAME = 64 << 20
# How long a sandbox that is exiting anyway may take to end and flush its own output.
_SETTLE_SECONDS = 5.0
_OWN_OUTPUT_CAP = 64 << 10
# How often a run answered before its sandbox ends looks whether its runner has ended (x1.5 each
# time; a look is cheap next to a sandbox's teardown).
_FIRST_POLL_SECONDS = 0.0002
_LAST_POLL_SECONDS = 0.005
# Frames whose bodies are a few fields (DONE, EXITED, ERROR; EXEC and REPLY never come from the sandbox).
_SMALL_FRAME = 64 << 10
# A DISPLAY frame's fields besides its base64 data.
_DISPLAY_ROOM = 4 << 10


def frame_limits(caps: RunCaps) -> dict[Kind, int]:
    """How large a frame of each kind from the sandbox may be; a larger one ends the run (FrameError).

    A CALL is ``max_call_bytes``, a DISPLAY the image cap in base64, a READY (a zygote's list of
    preloaded modules) 1 MiB, everything else 64 KiB.
    """
    display = 4 * ((caps.max_image_bytes + 2) // 3) + _DISPLAY_ROOM
    limits = dict.fromkeys(Kind, _SMALL_FRAME)
    limits.update({Kind.CALL: caps.max_call_bytes, Kind.DISPLAY: display, Kind.READY: 1 << 20})
    return {kind: min(limit, _MAX_FRAME - HEADER.size) for kind, limit in limits.items()}


class Interpreter:
    """One sandbox running the runner (or a zygote); see :func:`open_interpreter`."""

    def __init__(self, sandbox: Sandbox, channel: Channel, caps: RunCaps, frames: dict[Kind, int]) -> None:
        self.sandbox = sandbox
        self.channel = channel
        self.caps = caps
        self.own_stdout = CappedOutput(_OWN_OUTPUT_CAP)
        self.own_stderr = CappedOutput(_OWN_OUTPUT_CAP)
        self.exited = anyio.Event()  # the sandbox's process tree ended
        self.outcome: SandboxOutcome | None = None
        self._ready: Ready | None = None
        self._ids = itertools.count(1)
        self._own_ended = (anyio.Event(), anyio.Event())
        self._frames = frames  # for each forked run's channel: built once, not per run

    @property
    def ready(self) -> Ready:
        """What the runner said in its READY frame when it came up.

        Raises:
            RuntimeError: it has not said READY yet (only :func:`open_interpreter` sees that).
        """
        if self._ready is None:
            raise RuntimeError("the interpreter has not said READY")
        return self._ready

    def limit_events(self) -> LimitEvents:
        """How often the sandbox hit its memory and pids limits so far (counters; a run's are a difference)."""
        return self.sandbox.limit_events()

    async def _watch(self) -> None:
        self.outcome = await self.sandbox.wait()
        self.exited.set()

    async def _pump_own(self, stream: asyncio.StreamReader, stderr: bool, ended: anyio.Event) -> None:
        def feed(chunk: bytes) -> None:
            # Looked up per chunk: take_own_output() replaces the sinks between runs.
            (self.own_stderr if stderr else self.own_stdout).feed(chunk)

        try:
            await pump_stream(stream, feed)
        finally:
            ended.set()

    async def _handshake(self) -> None:
        """Wait for READY.

        Raises:
            SandboxStartError: the runner exited or said something else first.
        """
        try:
            frame = await self.channel.receive()
        except ChannelError:
            frame = None
        if isinstance(frame, Ready):
            self._ready = frame
            return
        with anyio.move_on_after(_SETTLE_SECONDS):
            await self.exited.wait()
            for ended in self._own_ended:
                await ended.wait()
        code = self.outcome.returncode if self.outcome is not None else "unknown"
        output = (self.own_stderr.text() or self.own_stdout.text()).strip()[-2000:]
        raise SandboxStartError(f"the sandbox did not start (exit {code}): {output}")

    def take_own_output(self) -> tuple[str, str]:
        """What the process itself wrote since the last call (normally nothing)."""
        out, err = self.own_stdout.text(), self.own_stderr.text()
        self.own_stdout = CappedOutput(_OWN_OUTPUT_CAP)
        self.own_stderr = CappedOutput(_OWN_OUTPUT_CAP)
        return out, err

    def _exec(
        self,
        request: ExecutionRequest,
        *,
        last: bool,
        cpu_seconds: int | None = None,
        guard: bytes | None = None,
        file_size: int | None = None,
        state: ForkState | None = None,
    ) -> Exec:
        return Exec(
            run=next(self._ids),
            code=request.code,
            servers=tuple(request.tools.servers) if request.tools is not None else (),
            env={**grant_environment(request.egress), **request.environment},
            max_images=self.caps.max_images,
            max_image_bytes=self.caps.max_image_bytes,
            last=last,
            cpu_seconds=cpu_seconds,
            guard=None if guard is None else _base64(guard),
            max_call_bytes=self.caps.max_call_bytes,
            file_size=file_size,
            state=None if state is None else state.size,
            mapped=state is not None and state.mapped,
            verdict=state is not None and state.verdict is not None,
        )

    async def run(
        self,
        record: RunRecord,
        request: ExecutionRequest,
        *,
        last: bool,
        file_size: int | None = None,
        early: bool = False,
        state: ForkState | None = None,
    ) -> SandboxOutcome | None:
        """Run ``request``'s code once; ``record`` gets its output, images and end as they come.

        With ``last`` the runner exits after the run, and this waits for the sandbox to end;
        with ``early`` too, after DONE it waits only until the runner has ended and nothing else
        runs, as the backend judges (:meth:`Sandbox.runner_ended`), and returns that outcome
        (the sandbox is torn down after the answer). None: the outcome is the sandbox's.
        ``file_size``: the run's RLIMIT_FSIZE, when lower than the sandbox's (see ``Exec``).
        ``state``: a fork's first run, its source's variables to load before the code (their file
        handed over read-only, see :mod:`.fork_state`; mapped by the runtime if ``state.mapped``).
        With ``state.verdict`` (a resumed session's, its seal not yet checked) the EXEC goes out at
        once and the check runs meanwhile; the runtime loads nothing until the VERDICT it is sent
        after. A state that fails: ``record.refused``, and the sandbox is killed (nothing of the
        state was loaded, no code ran; the caller discards the session).
        Bounded by the caller (its deadline); never raises for what the sandbox did.
        """
        frame = self._exec(request, last=last, file_size=file_size, state=state)
        return await self._serve_exec(record, frame, request, last=last, early=early, state=state)

    async def snapshot(self, budget: int, sink: Callable[[bytes], None]) -> bool:
        """Dump this session's variables as a fork's state (about ``budget`` bytes at most) into ``sink``;
        whether the runtime says it wrote them all.

        The runtime pickles them inside the sandbox and writes them as the run's stdout, which is
        handed to ``sink`` chunk by chunk (a :class:`.fork_state.Spool`'s) and kept nowhere else: the
        host never unpickles them, nor holds them whole. Bounded by the caller.
        """
        record = RunRecord(CappedOutput(0, sink), CappedOutput(_OWN_OUTPUT_CAP))
        frame = Exec(
            run=next(self._ids),
            code="",
            servers=(),
            env={},
            max_images=0,
            max_image_bytes=0,
            last=False,
            snapshot=budget,
        )
        await self._serve_exec(record, frame, None, last=False, early=False)
        return record.done and record.exit_code == 0 and record.protocol_error is None

    async def _serve_exec(
        self,
        record: RunRecord,
        frame: Exec,
        request: ExecutionRequest | None,
        *,
        last: bool,
        early: bool,
        state: ForkState | None = None,
    ) -> SandboxOutcome | None:
        tools = request.tools if request is not None else None
        carried = () if state is None else (state.fd,)
        async with run_pipes(record.stdout, record.stderr) as pipes:
            sent = await self._send_exec(record, frame, (*pipes.ends, *carried))
            pipes.close()
            if sent and state is not None and state.verdict is not None:
                async with anyio.create_task_group() as tasks:
                    tasks.start_soon(self._send_verdict, record, frame.run, state.verdict)
                    await serve_run(record, frame.run, tools, self.channel, self.caps)
            elif sent:
                await serve_run(record, frame.run, tools, self.channel, self.caps, dump=request is None)
            if record.protocol_error is not None:
                # The runner broke the protocol (an oversized or malformed frame): it cannot be
                # trusted to end the run, and what it still writes is not read. The run ends now.
                await self.kill()
                return None
            if last and early and record.done and (outcome := await self._runner_end()) is not None:
                pipes.ended = True  # nothing can write to them any more: what they hold is all
                return outcome
            if last or (record.channel_ended and record.protocol_error is None):
                # The runner is exiting: wait for the whole sandbox, then its own output.
                await self.exited.wait()
                with anyio.move_on_after(_SETTLE_SECONDS):
                    for own in self._own_ended:
                        await own.wait()
        return None

    async def _send_verdict(self, record: RunRecord, run: int, verdict: Callable[[], Awaitable[bool]]) -> None:
        """Check the run's state (``verdict``) and tell the runtime; a refused one's sandbox is killed."""
        held = await verdict()
        with contextlib.suppress(ChannelError):  # gone: the run's end says why
            await self.channel.send(Verdict(run, held))
        if not held:
            record.refused = True
            await self.kill()  # it mapped the state but loaded nothing of it: it serves nothing more

    async def _runner_end(self) -> SandboxOutcome | None:
        """The runner's outcome once the sandbox can tell it has ended (polled); None if the sandbox ended first."""
        delay = _FIRST_POLL_SECONDS
        while not self.exited.is_set():
            if (outcome := self.sandbox.runner_ended()) is not None:
                return outcome
            with anyio.move_on_after(delay):
                await self.exited.wait()
            delay = min(1.5 * delay, _LAST_POLL_SECONDS)
        return None

    async def run_forked(
        self,
        record: RunRecord,
        request: ExecutionRequest,
        *,
        cpu_seconds: int,
        guard: bytes,
        file_size: int | None = None,
    ) -> Exited | None:
        """Run ``request``'s code in a child the zygote forks for it; how the child ended, None if the zygote died.

        The child speaks on a socket of its own (its CALL, DISPLAY and DONE frames); the zygote
        answers on this interpreter's channel with EXITED once the child is gone, then restores
        the sandbox and says READY (see :meth:`restored`). The run is judged by EXITED, not by
        DONE, which the code could forge.
        ``guard`` is the seccomp filter the child stacks on its own before the code runs (see
        :func:`~mcp_sandbox.sandbox.seccomp.zygote_guard_bpf`). Bounded by the caller
        (its deadline); never raises for what the sandbox did.
        """
        frame = self._exec(request, last=True, cpu_seconds=cpu_seconds, guard=guard, file_size=file_size)
        host_end, child_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        run_channel = Channel(host_end, _MAX_FRAME, self._frames)
        exited: Exited | None = None
        try:
            async with run_pipes(record.stdout, record.stderr) as pipes:
                sent = await self._send_exec(record, frame, (*pipes.ends, child_end.fileno()))
                pipes.close()
                child_end.close()  # the child's copy is the only one: its end is the channel's end
                if sent:
                    await serve_run(record, frame.run, request.tools, run_channel, self.caps)
                    if record.protocol_error is not None:
                        await self.kill()  # as in run(): the run ends now, and with it this sandbox
                        return None
                    exited = await self._exited(frame.run)
        finally:
            child_end.close()
            run_channel.close()
        return exited

    async def _exited(self, run_id: int) -> Exited | None:
        """The zygote's EXITED frame for run ``run_id``; None if it said something else or died."""
        try:
            frame = await self.channel.receive()
        except ChannelError:
            return None
        if not isinstance(frame, Exited) or frame.run != run_id:
            return None
        return frame

    async def restored(self) -> str | None:
        """Wait for a zygote's READY after a run (it restored the sandbox); why it cannot serve again, or None.

        Bounded by the caller. The zygote restores the sandbox after it reported the run's end,
        so this is off the run's critical path: the warm pool awaits it before offering the
        sandbox again.
        """
        try:
            frame = await self.channel.receive()
        except ChannelError as exc:
            return f"the zygote broke its channel: {exc}"
        if frame is None:
            return "the zygote ended"
        if not isinstance(frame, Ready):
            return f"the zygote sent {frame.KIND.name} instead of READY"
        return frame.problem

    async def _send_exec(self, record: RunRecord, frame: Exec, fds: Sequence[int]) -> bool:
        """Send an EXEC frame with ``fds``; False (and ``record.channel_ended``) if the sandbox is gone."""
        try:
            await self.channel.send(frame, fds=fds)
        except ChannelError:
            record.channel_ended = True
            return False
        return True

    async def kill(self) -> SandboxOutcome:
        """Kill the whole sandbox (bounded, shielded); its outcome. Safe to call more than once."""
        with anyio.CancelScope(shield=True):
            self.channel.close()  # wakes a task still reading it
            outcome = await self.sandbox.aclose()
        if self.outcome is None:
            self.outcome = outcome
        self.exited.set()
        return outcome


@functools.lru_cache(maxsize=16)
def _base64(guard: bytes) -> str:
    """``guard`` in base64; a warm sandbox sends the same one with every run, encoded once."""
    return base64.b64encode(guard).decode()


@contextlib.asynccontextmanager
async def open_interpreter(backend: Backend, policy: SandboxPolicy, caps: RunCaps) -> AsyncIterator[Interpreter]:
    """Start a sandbox with ``policy`` running the runner, wait for READY; kill it on the way out.

    Raises:
        SandboxStartError: the sandbox could not be started, or its runner did not come up.
        BackendUnavailableError: the backend cannot run here.
    """
    sandbox = await backend.start(policy)
    frames = frame_limits(caps)
    interpreter = Interpreter(sandbox, Channel(sandbox.channel, _MAX_FRAME, frames), caps, frames)
    failure: Exception | None = None
    try:
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(interpreter._watch)
            tasks.start_soon(interpreter._pump_own, sandbox.stdout, False, interpreter._own_ended[0])
            tasks.start_soon(interpreter._pump_own, sandbox.stderr, True, interpreter._own_ended[1])
            try:
                await interpreter._handshake()
                yield interpreter
            except Exception as exc:  # raised below, not wrapped in the task group's ExceptionGroup
                failure = exc
            finally:
                tasks.cancel_scope.cancel()
    finally:
        await interpreter.kill()
    if failure is not None:
        raise failure
