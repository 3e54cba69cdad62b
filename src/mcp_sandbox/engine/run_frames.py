"""Serving one run: the sandbox's frames until its DONE, recorded in a :class:`RunRecord`.

CALL frames are answered concurrently (at most ``max_calls_in_flight`` at once), DISPLAY images
are kept within the caps, and an ERROR, a malformed frame or an unexpected kind ends the run.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import functools
import logging
from dataclasses import dataclass, field

import anyio
import anyio.to_thread
from anyio.abc import TaskGroup

from mcp_sandbox import tracing
from mcp_sandbox.engine.channel import OFF_LOOP_BYTES, Channel
from mcp_sandbox.engine.output import CappedOutput
from mcp_sandbox.engine.result import Image, OutputListener, ToolAccess
from mcp_sandbox.errors import ChannelError
from mcp_sandbox.protocol import Call, Display, Done, Error, Failure, Forked, Reply

__all__ = ["RunCaps", "RunRecord", "serve_run"]

logger = logging.getLogger(__name__)

_IMAGE_TYPES = frozenset({"image/png", "image/jpeg", "image/gif", "image/webp"})


@dataclass(frozen=True, slots=True)
class RunCaps:
    """What a run may send the host: images, the size of a CALL, CALLs answered at once."""

    max_images: int
    max_image_bytes: int
    max_call_bytes: int
    max_calls_in_flight: int


@dataclass
class RunRecord:
    """What one run produced; filled while it runs, so a run cut short still has its output so far."""

    stdout: CappedOutput
    stderr: CappedOutput
    images: list[Image] = field(default_factory=list)
    images_dropped: int = 0
    done: bool = False  # the runner reported the run's end (DONE)
    exit_code: int | None = None  # the exit code DONE reported
    exception: str | None = None  # the uncaught exception's name DONE reported (the code's own word)
    channel_ended: bool = False  # the runner closed the channel (it is exiting or dead)
    protocol_error: str | None = None
    forked: Forked | None = None  # a fork's first run: what its DONE says it carried
    refused: bool = False  # the state it was to load failed its seal: the sandbox was killed, nothing loaded

    @classmethod
    def capped(cls, cap: int, listener: OutputListener | None = None) -> RunRecord:
        """A record keeping ``cap`` bytes of each stream; ``listener`` sees every chunk as it comes."""
        if listener is None:
            return cls(CappedOutput(cap), CappedOutput(cap))
        return cls(
            CappedOutput(cap, functools.partial(listener, "stdout")),
            CappedOutput(cap, functools.partial(listener, "stderr")),
        )


async def serve_run(
    record: RunRecord, run_id: int, tools: ToolAccess | None, channel: Channel, caps: RunCaps, *, dump: bool = False
) -> None:
    """Serve the runner's frames on ``channel`` until run ``run_id``'s DONE, an ERROR or the channel's end.

    A traced request's run (not the ``dump`` of a session's variables) is told on the span it runs
    under, its placement's: an ``mcp_sandbox.run.start`` event as the code is handed over, and how it
    ended. Not a span of its own: it would cover nearly the same time and cost as much again.
    """
    span = None if dump else tracing.current()
    if span is not None:
        span.add_event("mcp_sandbox.run.start")
    first = await _serve(record, run_id, channel, caps)
    if first is not None:
        # From its first CALL on, the run's calls are answered in a task group of their own: most
        # runs call nothing, and a task group entered and left costs more than a small run's frames.
        async with anyio.create_task_group() as group:
            try:
                calls = _Calls(tools, group, anyio.Semaphore(caps.max_calls_in_flight), channel)
                await calls.answer(first)
                await _serve(record, run_id, channel, caps, calls)
            finally:
                group.cancel_scope.cancel()
    if span is not None:
        span.set_attributes(_ended(record))


def _ended(record: RunRecord) -> dict[str, tracing.AttributeValue]:
    """How the run ended, as its placement span says it: whether it finished, its exit code (never its
    exception's text)."""
    ended: dict[str, tracing.AttributeValue] = {"mcp_sandbox.run.done": record.done}
    if record.exit_code is not None:
        ended["mcp_sandbox.run.exit_code"] = record.exit_code
    return ended


@dataclass
class _Calls:
    """The CALLs of a run being answered, at most ``in_flight``'s value at once."""

    tools: ToolAccess | None
    group: TaskGroup
    in_flight: anyio.Semaphore
    channel: Channel

    async def answer(self, call: Call) -> None:
        """Answer ``call`` in a task of its own, once fewer than the cap are (the channel waits meanwhile)."""
        await self.in_flight.acquire()
        self.group.start_soon(_answer, self.tools, call, self.channel, self.in_flight)


async def _serve(
    record: RunRecord, run_id: int, channel: Channel, caps: RunCaps, calls: _Calls | None = None
) -> Call | None:
    """Serve frames until this run's DONE, an ERROR or the end of the channel; without ``calls``,
    until its first CALL, which is returned (the caller answers it and serves on with ``calls``).

    At most ``max_calls_in_flight`` CALLs are answered at once: at the cap the channel is not
    read until one finishes (the sandbox's writes block), so a run cannot queue up work or
    memory on the host.
    """
    try:
        while (frame := await channel.receive()) is not None:
            if isinstance(frame, Call):
                if calls is None:
                    return frame
                await calls.answer(frame)
            elif isinstance(frame, Done):
                if frame.run != run_id:
                    continue  # a previous run's, or forged by the code: not this run's end
                record.done = True
                record.exit_code = frame.exit_code
                record.exception = frame.exception
                record.forked = frame.fork
                return None
            elif isinstance(frame, Display):
                if frame.run == run_id:
                    await _collect_image(record, frame, caps)
            elif isinstance(frame, Error):
                record.protocol_error = frame.message
                return None
            else:
                record.protocol_error = f"unexpected frame {frame.KIND.name} from the sandbox"
                with contextlib.suppress(ChannelError):
                    await channel.send(Error(record.protocol_error))
                return None
        record.channel_ended = True
    except ChannelError as exc:
        # Sandboxed code can write garbage on its own channel: that ends the run, not the host.
        record.protocol_error = str(exc)
    return None


async def _collect_image(record: RunRecord, frame: Display, caps: RunCaps) -> None:
    """Keep one DISPLAY image if it is well-formed and within the caps (the runner checks them too)."""
    if frame.mime not in _IMAGE_TYPES or len(record.images) >= caps.max_images:
        record.images_dropped += 1
        return
    if len(frame.data) > OFF_LOOP_BYTES:
        decoded = await anyio.to_thread.run_sync(_b64decode, frame.data)
    else:
        decoded = _b64decode(frame.data)
    if decoded is None or len(decoded) > caps.max_image_bytes or len(record.images) >= caps.max_images:
        record.images_dropped += 1
        return
    record.images.append(Image(frame.mime, decoded))


async def _answer(tools: ToolAccess | None, call: Call, channel: Channel, slot: anyio.Semaphore) -> None:
    """Answer one CALL frame with a REPLY carrying the same id; give back its ``slot``."""
    try:
        await _reply(tools, call, channel)
    finally:
        slot.release()


async def _reply(tools: ToolAccess | None, call: Call, channel: Channel) -> None:
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


def _b64decode(data: str) -> bytes | None:
    try:
        return base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError):
        return None
