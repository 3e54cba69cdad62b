"""Capped capture of a sandbox's stdout/stderr: its process's pipes and each run's own pipes.

The two pumps are the only readers of output: :func:`pump_stream` for the sandbox process's own
stdout/stderr (the backend's stream readers), :func:`pump_fd` for a run's pipes.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable

import anyio
import anyio.lowlevel

__all__ = ["CappedOutput", "pump_fd", "pump_stream"]

_CHUNK = 64 << 10
_READS_PER_TURN = 8  # at most 512 KiB read between two turns of the event loop


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
