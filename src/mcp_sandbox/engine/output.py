"""Capped capture of a sandbox's stdout/stderr: its process's pipes and each run's own pipes.

The two pumps are the only readers of output: :func:`pump_stream` for the sandbox process's own
stdout/stderr (the backend's stream readers), :func:`pump_fd` for a run's pipes, which
:func:`run_pipes` creates and drains.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator, Callable

import anyio
import anyio.lowlevel

__all__ = ["DRAIN_SECONDS", "CappedOutput", "RunPipes", "pump_fd", "pump_stream", "run_pipes"]

_CHUNK = 64 << 10
_READS_PER_TURN = 8  # at most 512 KiB read between two turns of the event loop
# After DONE, how long the host still reads a run's pipes that have not ended (a background
# process of the run holds them); then it stops, and that process's later output is lost.
DRAIN_SECONDS = 0.25


class CappedOutput:
    """Keeps the first ``cap`` bytes of a stream and counts the rest.

    Reading never stops at the cap, so the writer never blocks on a full pipe; what is past
    the cap is counted and dropped. ``listener``, when given, sees every chunk as it comes
    (for progress notifications while the run lasts); it must not block.
    """

    def __init__(self, cap: int, listener: Callable[[bytes], None] | None = None) -> None:
        self.cap = cap
        self.total = 0
        self._chunks: list[bytes] = []
        self._kept = 0
        self._listener = listener

    @property
    def truncated(self) -> bool:
        return self.total > self._kept

    def feed(self, data: bytes) -> None:
        self.total += len(data)
        if self._listener is not None:
            self._listener(data)
        room = self.cap - self._kept
        if room > 0:
            kept = data[:room]
            self._chunks.append(kept)
            self._kept += len(kept)

    def text(self) -> str:
        """The kept bytes as text (invalid UTF-8 replaced), with a marker when truncated."""
        text = b"".join(self._chunks).decode("utf-8", errors="replace")
        if self.truncated:
            text += f"\n[output truncated: {self.total} bytes written, first {self._kept} bytes shown]\n"
        return text


async def pump_stream(stream: asyncio.StreamReader, feed: Callable[[bytes], None]) -> None:
    """Read ``stream`` to its end, handing each chunk to ``feed`` (``CappedOutput.feed``, say)."""
    while chunk := await stream.read(_CHUNK):
        feed(chunk)


async def pump_fd(fd: int, feed: Callable[[bytes], None]) -> None:
    """Read the pipe ``fd`` until its end (every writer closed it), handing each chunk to ``feed``.

    ``fd`` is made non-blocking; the caller closes it, after this returned or was cancelled.
    """
    os.set_blocking(fd, False)
    reads = 0  # since this task last gave the loop a turn
    while True:
        try:
            chunk = os.read(fd, _CHUNK)
        except BlockingIOError:
            reads = 0
            await anyio.wait_readable(fd)
            continue
        if not chunk:
            return
        feed(chunk)
        reads += 1
        if reads == _READS_PER_TURN:
            # A writer that never pauses keeps the pipe readable: yield now and then, or the loop
            # starves. (Not after every read: a run's few lines and its end come without a turn.)
            reads = 0
            await anyio.lowlevel.checkpoint()


class RunPipes:
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
async def run_pipes(stdout: CappedOutput, stderr: CappedOutput) -> AsyncIterator[RunPipes]:
    """A run's stdout and stderr pipes, pumped into ``stdout`` and ``stderr`` while the block runs.

    On the way out the write ends are closed (if the block did not) and the pipes are read for
    at most :data:`DRAIN_SECONDS` more (a background process of the run may hold them).
    """
    out_read, out_write = os.pipe()
    err_read, err_write = os.pipe()
    pipes = RunPipes(out_write, err_write)
    try:
        async with anyio.create_task_group() as pumps:
            ended = (anyio.Event(), anyio.Event())
            pumps.start_soon(_pump_pipe, out_read, stdout, ended[0])
            pumps.start_soon(_pump_pipe, err_read, stderr, ended[1])
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
            _read_left(out_read, stdout)
            _read_left(err_read, stderr)
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
