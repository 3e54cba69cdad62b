"""Progress notifications while a run lasts: each line the code prints, as the ``message``.

When a ``tools/call`` carries ``_meta.progressToken``, the run's output is cut into lines as
it comes and each line goes to the client as ``notifications/progress`` with ``progress``
counting the lines so far (stdout and stderr together), so it only grows. A sender task paces
them: when code prints faster than :data:`BATCH` lines per :data:`INTERVAL`, the oldest
pending lines are skipped (the counter still counts them, so a client sees the gap). The
result itself always carries the whole output; these are a live view of it.
"""

from __future__ import annotations

import collections
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, Literal

import anyio

from mcp_sandbox.engine import OutputListener

__all__ = ["BATCH", "INTERVAL", "MAX_LINE", "ProgressLines", "progress_listener"]

logger = logging.getLogger(__name__)

BATCH = 20  # lines kept pending at most; older ones are skipped
INTERVAL = 0.1  # seconds between batches
MAX_LINE = 1000  # characters of one line sent (a longer line is cut)
_FLUSH_SECONDS = 2.0  # how long the last lines may take to go out once the run is over
_MAX_PARTIAL = 64 << 10  # bytes of a line without its end kept before it is sent as it is

Send = Callable[[float, str], Awaitable[None]]


class ProgressLines:
    """Cuts a run's output into lines and sends each one through ``send(progress, message)``."""

    def __init__(self, send: Send) -> None:
        self._send = send
        self._partial: dict[str, bytes] = {"stdout": b"", "stderr": b""}
        self._pending: collections.deque[tuple[int, str]] = collections.deque(maxlen=BATCH)
        self._count = 0
        self._wake = anyio.Event()
        self._broken = False

    def feed(self, stream: Literal["stdout", "stderr"], data: bytes) -> None:
        """Take a chunk of ``stream`` (an :data:`~mcp_sandbox.engine.OutputListener`); never blocks."""
        buffered = self._partial[stream] + data.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        *lines, rest = buffered.split(b"\n")
        if len(rest) > _MAX_PARTIAL:
            lines.append(rest)
            rest = b""
        self._partial[stream] = rest
        # Only the last BATCH lines can still be sent: count the others without decoding them.
        self._count += max(0, len(lines) - BATCH)
        for line in lines[-BATCH:]:
            self._line(line)

    def _line(self, line: bytes) -> None:
        self._count += 1
        text = line.decode("utf-8", errors="replace")
        if len(text) > MAX_LINE:
            text = text[:MAX_LINE] + "…"
        self._pending.append((self._count, text))
        self._wake.set()

    def finish(self) -> None:
        """The run is over: what is left of a last line without its end becomes a line."""
        for stream, rest in self._partial.items():
            if rest:
                self._partial[stream] = b""
                self._line(rest)

    async def _drain(self) -> None:
        while self._pending and not self._broken:
            progress, message = self._pending.popleft()
            try:
                await self._send(progress, message)
            except Exception as exc:  # a client gone or a transport that cannot notify: the run goes on
                logger.debug("progress notifications stop: %s", exc)
                self._broken = True

    async def serve(self) -> None:
        """Send lines as they come, a batch per :data:`INTERVAL`, until cancelled."""
        while True:
            await self._wake.wait()
            self._wake = anyio.Event()
            await self._drain()
            await anyio.sleep(INTERVAL)

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[OutputListener]:
        """Send while the block runs; on the way out, the last lines (bounded), then stop."""
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(self.serve)
            try:
                yield self.feed
            finally:
                tasks.cancel_scope.cancel()
        self.finish()
        with anyio.move_on_after(_FLUSH_SECONDS):
            await self._drain()


def _progress_token(ctx: Any) -> str | int | None:
    meta = getattr(ctx, "meta", None)
    token = meta.get("progress_token") if isinstance(meta, dict) else None
    return token if isinstance(token, str | int) and not isinstance(token, bool) else None


@contextlib.asynccontextmanager
async def progress_listener(ctx: Any) -> AsyncIterator[OutputListener | None]:
    """An output listener that reports the run's lines to the caller of this request, or None.

    None when the request asked for no progress (no ``_meta.progressToken``), or when ``ctx`` is
    not a request context of the SDK's server (an in-process caller).
    """
    session = getattr(ctx, "session", None)
    if _progress_token(ctx) is None or session is None:
        yield None
        return

    async def send(progress: float, message: str) -> None:
        await session.report_progress(progress, None, message)

    async with ProgressLines(send).running() as listener:
        yield listener
