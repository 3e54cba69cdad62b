"""Capped capture of a sandbox's stdout/stderr: its process's pipes and each run's own pipes.

The two pumps are the only readers of output: :func:`pump_stream` for the sandbox process's own
stdout/stderr (the backend's stream readers), and the event loop's readers of a run's pipes,
which :func:`run_pipes` creates and drains.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator, Callable

import anyio

__all__ = ["DRAIN_SECONDS", "CappedOutput", "RunPipes", "pump_stream", "run_pipes"]

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


class _Pumps:
    """The read ends of a run's pipes, each read by the event loop whenever it is readable.

    Readers of the loop (``add_reader``), not a task per pipe: a run's two pump tasks in a task
    group cost more of the server's CPU than all the reading a small run's output needs. A
    callback reads at most :data:`_READS_PER_TURN` chunks, then gives the loop its turn (the pipe,
    still readable, is offered again at the next one), so a writer that never pauses cannot
    starve the loop. What a ``feed`` raises stops the reading and is raised by :meth:`check`.
    """

    def __init__(self, sinks: dict[int, CappedOutput]) -> None:
        self._loop = asyncio.get_running_loop()
        self._sinks = sinks
        self._open = set(sinks)
        self.ended = anyio.Event()  # every pipe ended (or the reading failed)
        self.failure: BaseException | None = None
        try:
            for fd in sinks:
                os.set_blocking(fd, False)
                self._loop.add_reader(fd, self._read, fd)
        except BaseException:
            self.stop()  # no reader is left on a descriptor the caller is about to close
            raise

    def _read(self, fd: int) -> None:
        sink = self._sinks[fd]
        try:
            for _ in range(_READS_PER_TURN):
                try:
                    chunk = os.read(fd, _CHUNK)
                except BlockingIOError:
                    return
                if not chunk:
                    self._stop(fd)
                    return
                sink.feed(chunk)
        except Exception as exc:  # a listener's or the read's: the run's, raised by check()
            self.failure = exc
            self.stop()

    def _stop(self, fd: int) -> None:
        if fd in self._open:
            self._open.discard(fd)
            self._loop.remove_reader(fd)
        if not self._open:
            self.ended.set()

    def stop(self) -> None:
        """Stop reading (before the pipes are closed: the loop must not watch a closed descriptor)."""
        for fd in list(self._open):
            self._stop(fd)

    def check(self) -> None:
        """Raise what stopped the reading, if anything did."""
        if self.failure is not None:
            raise self.failure


@contextlib.asynccontextmanager
async def run_pipes(stdout: CappedOutput, stderr: CappedOutput) -> AsyncIterator[RunPipes]:
    """A run's stdout and stderr pipes, pumped into ``stdout`` and ``stderr`` while the block runs.

    On the way out the write ends are closed (if the block did not) and the pipes are read for
    at most :data:`DRAIN_SECONDS` more (a background process of the run may hold them).
    """
    out_read, out_write = os.pipe()
    err_read, err_write = os.pipe()
    pipes = RunPipes(out_write, err_write)
    pumps = None
    try:
        pumps = _Pumps({out_read: stdout, err_read: stderr})
        try:
            yield pipes
        finally:
            pipes.close()
        if not pipes.ended and not pumps.ended.is_set():  # (wait() on a set event still yields to the loop)
            with anyio.move_on_after(DRAIN_SECONDS):
                await pumps.ended.wait()
        pumps.stop()
        pumps.check()
        if pipes.ended:
            _read_left(out_read, stdout)
            _read_left(err_read, stderr)
    finally:
        if pumps is not None:
            pumps.stop()
        pipes.close()
        os.close(out_read)
        os.close(err_read)


def _read_left(fd: int, sink: CappedOutput) -> None:
    """Read what the pipe ``fd`` holds now (its writers are gone or cannot write) without waiting."""
    os.set_blocking(fd, False)
    with contextlib.suppress(BlockingIOError):
        while chunk := os.read(fd, 1 << 16):
            sink.feed(chunk)
