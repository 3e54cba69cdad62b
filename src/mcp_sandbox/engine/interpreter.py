"""A live interpreter: a sandbox running the in-sandbox runner, serving runs one at a time.

A fresh run is an interpreter that serves one run (its EXEC frame says ``last``) and exits; a
session keeps one interpreter for many runs. Either way each run gets its own stdout/stderr
pipes, created here and passed to the runner with the EXEC frame, so the host sees the end of
a run's output when the run is over (or, when code left a background process holding the
pipes, stops reading a short while after DONE). The process's own stdout/stderr carry only
the runtime's own failures (bootstrap errors, a crash trace written outside a run).
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import functools
import itertools
import logging
import os
import socket
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import anyio
import anyio.to_thread
from anyio.abc import TaskGroup

from mcp_sandbox.config import Settings
from mcp_sandbox.engine.channel import OFF_LOOP_BYTES, Channel
from mcp_sandbox.engine.output import CappedOutput, pump_fd, pump_stream
from mcp_sandbox.engine.result import Image, OutputListener, ToolAccess
from mcp_sandbox.errors import ChannelError, SandboxStartError
from mcp_sandbox.protocol import (
    HEADER,
    Call,
    Display,
    Done,
    Error,
    Exec,
    Exited,
    Failure,
    Kind,
    Ready,
    Reply,
)
from mcp_sandbox.sandbox.backends import Backend, Sandbox, SandboxOutcome
from mcp_sandbox.sandbox.policy import SandboxPolicy

# Exited: how a zygote's child ended (its EXITED frame), as run_forked() returns it.
__all__ = ["DRAIN_SECONDS", "Exited", "Interpreter", "RunRecord", "frame_limits", "open_interpreter"]

logger = logging.getLogger(__name__)

_MAX_FRAME = 64 << 20
# After DONE, how long the host still reads a run's pipes that have not ended (a background
# process of the run holds them); then it stops, and that process's later output is lost.
DRAIN_SECONDS = 0.25
# How long a sandbox that is exiting anyway may take to end and flush its own output.
_SETTLE_SECONDS = 5.0
_OWN_OUTPUT_CAP = 64 << 10
# How often a run answered before its sandbox ends looks whether its runner has ended (x1.5 each
# time; a look costs ~50 us).
_FIRST_POLL_SECONDS = 0.0002
_LAST_POLL_SECONDS = 0.005
_IMAGE_TYPES = frozenset({"image/png", "image/jpeg", "image/gif", "image/webp"})
# Frames whose bodies are a few fields (DONE, EXITED, ERROR; EXEC and REPLY never come from the sandbox).
_SMALL_FRAME = 64 << 10
# A DISPLAY frame's fields besides its base64 data.
_DISPLAY_ROOM = 4 << 10


def frame_limits(settings: Settings) -> dict[Kind, int]:
    """How large a frame of each kind from the sandbox may be; a larger one ends the run (FrameError).

    A CALL is ``max_call_bytes``, a DISPLAY the image cap in base64, a READY (a zygote's list of
    preloaded modules) 1 MiB, everything else 64 KiB.
    """
    display = 4 * ((settings.max_image_bytes + 2) // 3) + _DISPLAY_ROOM
    limits = dict.fromkeys(Kind, _SMALL_FRAME)
    limits.update({Kind.CALL: settings.max_call_bytes, Kind.DISPLAY: display, Kind.READY: 1 << 20})
    return {kind: min(limit, _MAX_FRAME - HEADER.size) for kind, limit in limits.items()}


@dataclass
class RunRecord:
    """What one run produced; filled while it runs, so a run cut short still has its output so far."""

    stdout: CappedOutput
    stderr: CappedOutput
    images: list[Image] = field(default_factory=list)
    images_dropped: int = 0
    done: bool = False  # the runner reported the run's end (DONE)
    exit_code: int | None = None  # the exit code DONE reported
    channel_ended: bool = False  # the runner closed the channel (it is exiting or dead)
    protocol_error: str | None = None

    @classmethod
    def capped(cls, cap: int, listener: OutputListener | None = None) -> RunRecord:
        """A record keeping ``cap`` bytes of each stream; ``listener`` sees every chunk as it comes."""
        if listener is None:
            return cls(CappedOutput(cap), CappedOutput(cap))
        return cls(
            CappedOutput(cap, functools.partial(listener, "stdout")),
            CappedOutput(cap, functools.partial(listener, "stderr")),
        )


class Interpreter:
    """One sandbox running the runner (or a zygote); see :func:`open_interpreter`."""

    def __init__(self, sandbox: Sandbox, channel: Channel, settings: Settings) -> None:
        self.sandbox = sandbox
        self.channel = channel
        self.settings = settings
        self.own_stdout = CappedOutput(_OWN_OUTPUT_CAP)
        self.own_stderr = CappedOutput(_OWN_OUTPUT_CAP)
        self.exited = anyio.Event()  # the sandbox's process tree ended
        self.outcome: SandboxOutcome | None = None
        self.ready: dict[str, Any] = {}  # what the runner said in its READY frame (checked: a Ready's body)
        self._ids = itertools.count(1)
        self._own_ended = (anyio.Event(), anyio.Event())
        self._limits = frame_limits(settings)  # for each forked run's channel: built once, not per run

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
            self.ready = frame.encode()
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
        code: str,
        servers: Sequence[str],
        environment: Mapping[str, str],
        *,
        last: bool,
        cpu_seconds: int | None = None,
        guard: bytes | None = None,
        file_size: int | None = None,
    ) -> Exec:
        return Exec(
            run=next(self._ids),
            code=code,
            servers=tuple(servers),
            env=dict(environment),
            max_images=self.settings.max_images,
            max_image_bytes=self.settings.max_image_bytes,
            last=last,
            cpu_seconds=cpu_seconds,
            guard=None if guard is None else _base64(guard),
            max_call_bytes=self.settings.max_call_bytes,
            file_size=file_size,
        )

    async def run(
        self,
        record: RunRecord,
        *,
        code: str,
        servers: Sequence[str],
        environment: Mapping[str, str],
        tools: ToolAccess | None,
        last: bool,
        file_size: int | None = None,
        early: bool = False,
    ) -> SandboxOutcome | None:
        """Run ``code`` once; ``record`` gets its output, images and end as they come.

        With ``last`` the runner exits after the run, and this waits for the sandbox to end;
        with ``early`` too, after DONE it waits only until the runner has ended and nothing else
        runs, as the backend judges (:meth:`Sandbox.runner_ended`), and returns that outcome
        (the sandbox is torn down after the answer). None: the outcome is the sandbox's.
        ``file_size``: the run's RLIMIT_FSIZE, when lower than the sandbox's (see ``Exec``).
        Bounded by the caller (its deadline); never raises for what the sandbox did.
        """
        frame = self._exec(code, servers, environment, last=last, file_size=file_size)
        async with _run_pipes(record) as pipes:
            sent = await self._send_exec(record, frame, pipes.ends)
            pipes.close()
            if sent:
                await self._serve_run(record, frame.run, tools, self.channel)
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
        *,
        code: str,
        servers: Sequence[str],
        environment: Mapping[str, str],
        tools: ToolAccess | None,
        cpu_seconds: int,
        guard: bytes,
        file_size: int | None = None,
    ) -> Exited | None:
        """Run ``code`` in a child the zygote forks for it; how the child ended, None if the zygote died.

        The child speaks on a socket of its own (its CALL, DISPLAY and DONE frames); the zygote
        answers on this interpreter's channel with EXITED once the child is gone, then restores
        the sandbox and says READY (see :meth:`restored`). The run is judged by EXITED, not by
        DONE, which the code could forge.
        ``guard`` is the seccomp filter the child stacks on its own before the code runs (see
        :func:`~mcp_sandbox.sandbox.seccomp.zygote_guard_bpf`). Bounded by the caller
        (its deadline); never raises for what the sandbox did.
        """
        frame = self._exec(
            code, servers, environment, last=True, cpu_seconds=cpu_seconds, guard=guard, file_size=file_size
        )
        host_end, child_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        run_channel = Channel(host_end, _MAX_FRAME, self._limits)
        exited: Exited | None = None
        try:
            async with _run_pipes(record) as pipes:
                sent = await self._send_exec(record, frame, (*pipes.ends, child_end.fileno()))
                pipes.close()
                child_end.close()  # the child's copy is the only one: its end is the channel's end
                if sent:
                    await self._serve_run(record, frame.run, tools, run_channel)
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

    async def _serve_run(self, record: RunRecord, run_id: int, tools: ToolAccess | None, channel: Channel) -> None:
        async with anyio.create_task_group() as calls:
            try:
                await self._serve(record, run_id, tools, calls, channel)
            finally:
                calls.cancel_scope.cancel()

    async def _serve(
        self, record: RunRecord, run_id: int, tools: ToolAccess | None, calls: TaskGroup, channel: Channel
    ) -> None:
        """Serve the runner's frames until this run's DONE, an ERROR or the end of the channel.

        At most ``max_calls_in_flight`` CALLs are answered at once: at the cap the channel is not
        read until one finishes (the sandbox's writes block), so a run cannot queue up work or
        memory on the host.
        """
        in_flight = anyio.Semaphore(self.settings.max_calls_in_flight)
        try:
            while (frame := await channel.receive()) is not None:
                if isinstance(frame, Call):
                    await in_flight.acquire()
                    calls.start_soon(self._answer, tools, frame, channel, in_flight)
                elif isinstance(frame, Done):
                    if frame.run != run_id:
                        continue  # a previous run's, or forged by the code: not this run's end
                    record.done = True
                    record.exit_code = frame.exit_code
                    return
                elif isinstance(frame, Display):
                    if frame.run == run_id:
                        await self._collect_image(record, frame)
                elif isinstance(frame, Error):
                    record.protocol_error = frame.message
                    return
                else:
                    record.protocol_error = f"unexpected frame {frame.KIND.name} from the sandbox"
                    with contextlib.suppress(ChannelError):
                        await channel.send(Error(record.protocol_error))
                    return
            record.channel_ended = True
        except ChannelError as exc:
            # Sandboxed code can write garbage on its own channel: that ends the run, not the host.
            record.protocol_error = str(exc)

    async def _collect_image(self, record: RunRecord, frame: Display) -> None:
        """Keep one DISPLAY image if it is well-formed and within the caps (the runner checks them too)."""
        if frame.mime not in _IMAGE_TYPES or len(record.images) >= self.settings.max_images:
            record.images_dropped += 1
            return
        if len(frame.data) > OFF_LOOP_BYTES:
            decoded = await anyio.to_thread.run_sync(_b64decode, frame.data)
        else:
            decoded = _b64decode(frame.data)
        if (
            decoded is None
            or len(decoded) > self.settings.max_image_bytes
            or len(record.images) >= self.settings.max_images
        ):
            record.images_dropped += 1
            return
        record.images.append(Image(frame.mime, decoded))

    async def _answer(self, tools: ToolAccess | None, call: Call, channel: Channel, slot: anyio.Semaphore) -> None:
        """Answer one CALL frame with a REPLY carrying the same id; give back its ``slot``."""
        try:
            await self._reply(tools, call, channel)
        finally:
            slot.release()

    async def _reply(self, tools: ToolAccess | None, call: Call, channel: Channel) -> None:
        if tools is None:
            reply = Reply(call.id, error=Failure("denied", "this run may not call any MCP server: pass `servers`"))
        else:
            try:
                reply = await tools.handle(call)
            except Exception as exc:  # a bug in one request must not end the run, let alone the server
                logger.exception("answering a request from the sandbox failed")
                reply = Reply(call.id, error=Failure("unavailable", f"internal error: {exc}"))
        with contextlib.suppress(ChannelError):  # the sandbox is gone; the run's outcome says why
            await channel.send(reply)

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


def _b64decode(data: str) -> bytes | None:
    try:
        return base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError):
        return None


class _Pipes:
    """The write ends of a run's stdout and stderr pipes, until they are sent."""

    def __init__(self, stdout: int, stderr: int) -> None:
        self.ends = (stdout, stderr)
        self.ended = False  # no process can write to them any more: read what they hold, then stop
        self._open = True

    def close(self) -> None:
        """Close ours: the pipes end when the runner (and what it started) closes its copies."""
        if self._open:
            self._open = False
            for fd in self.ends:
                os.close(fd)


@contextlib.asynccontextmanager
async def _run_pipes(record: RunRecord) -> AsyncIterator[_Pipes]:
    """A run's stdout and stderr pipes, pumped into ``record`` while the block runs.

    On the way out the write ends are closed (if the block did not) and the pipes are read for
    at most :data:`DRAIN_SECONDS` more (a background process of the run may hold them).
    """
    out_read, out_write = os.pipe()
    err_read, err_write = os.pipe()
    pipes = _Pipes(out_write, err_write)
    try:
        async with anyio.create_task_group() as pumps:
            ended = (anyio.Event(), anyio.Event())
            pumps.start_soon(_pump_pipe, out_read, record.stdout, ended[0])
            pumps.start_soon(_pump_pipe, err_read, record.stderr, ended[1])
            try:
                yield pipes
            finally:
                pipes.close()
            if not pipes.ended:
                with anyio.move_on_after(DRAIN_SECONDS):
                    for end in ended:
                        if not end.is_set():  # (wait() on a set event still yields to the loop)
                            await end.wait()
            pumps.cancel_scope.cancel()
        if pipes.ended:
            _read_left(out_read, record.stdout)
            _read_left(err_read, record.stderr)
    finally:
        os.close(out_read)
        os.close(err_read)


def _read_left(fd: int, sink: CappedOutput) -> None:
    """Read what the pipe ``fd`` holds now (its writers are gone or cannot write) without waiting."""
    os.set_blocking(fd, False)
    with contextlib.suppress(BlockingIOError):
        while chunk := os.read(fd, 1 << 16):
            sink.feed(chunk)


async def _pump_pipe(fd: int, sink: CappedOutput, ended: anyio.Event) -> None:
    try:
        await pump_fd(fd, sink.feed)
    finally:
        ended.set()


@contextlib.asynccontextmanager
async def open_interpreter(backend: Backend, policy: SandboxPolicy, settings: Settings) -> AsyncIterator[Interpreter]:
    """Start a sandbox with ``policy`` running the runner, wait for READY; kill it on the way out.

    Raises:
        SandboxStartError: the sandbox could not be started, or its runner did not come up.
        BackendUnavailableError: the backend cannot run here.
    """
    sandbox = await backend.start(policy)
    interpreter = Interpreter(sandbox, Channel(sandbox.channel, _MAX_FRAME, frame_limits(settings)), settings)
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
