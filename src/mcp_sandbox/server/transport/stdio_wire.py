"""The stdio wire read and written on the event loop, without a worker thread per line.

The SDK's stdio transport reads and writes through ``anyio.wrap_file``: every line read, every
message written and every flush is a hop to a worker thread and back, three per request and
its answer. When the wire is a pipe or a socket (what clients spawn their servers with), these
readers and writers (:class:`WireLines`, :class:`WireWriter`) wait for it on the event loop
instead and then read or write without blocking. Neither changes the descriptor's flags (it may
be shared with the process that started us). Anything else (a regular file, a terminal) is
served through ``anyio.wrap_file`` as the SDK does.
"""

from __future__ import annotations

import codecs
import io
import os
import select
import stat
from collections.abc import AsyncIterator, Callable

import anyio
import anyio.to_thread

__all__ = ["DIRECT_BYTES", "WireLines", "WireWriter", "loop_native"]

DIRECT_BYTES = 4096  # PIPE_BUF: a writable pipe takes this much without blocking
_CHUNK = 64 << 10


def loop_native(fd: int) -> bool:
    """Whether ``fd`` is a pipe or a socket, which the event loop can wait for."""
    try:
        mode = os.fstat(fd).st_mode
    except OSError:
        return False
    return stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode)


class WireLines:
    """The client's lines (each ending with ``\\n`` but the last) on ``fd``.

    It reads whatever is there once the wire is readable (a read of a readable pipe or socket
    returns at once) and cuts it into lines as ``TextIOWrapper`` does (UTF-8, invalid bytes
    replaced, ``\\r\\n`` and a lone ``\\r`` end a line too, read as ``\\n``).
    ``before``, when given, is called (in a worker thread) before ``fd`` is first read: it may
    block until another reader is done with ``fd`` and returns what that reader read of it.
    """

    def __init__(self, fd: int, before: Callable[[], bytes] | None = None) -> None:
        self._fd = fd
        self._before = before
        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._decoder = io.IncrementalNewlineDecoder(decoder, translate=True)

    def __aiter__(self) -> AsyncIterator[str]:
        return self._lines()

    async def _lines(self) -> AsyncIterator[str]:
        first = b"" if self._before is None else await anyio.to_thread.run_sync(self._before)
        pending = self._decoder.decode(first)
        while True:
            *lines, pending = pending.split("\n")
            for line in lines:
                yield line + "\n"
            await anyio.wait_readable(self._fd)
            chunk = os.read(self._fd, _CHUNK)
            if not chunk:
                pending += self._decoder.decode(b"", final=True)
                if pending:
                    *lines, pending = pending.split("\n")
                    for line in lines:
                        yield line + "\n"
                    if pending:
                        yield pending
                return
            pending += self._decoder.decode(chunk)


class WireWriter:
    """Writes the server's messages to ``fd``; ``flush`` has nothing to do.

    A message of at most :data:`DIRECT_BYTES` is written once the wire is writable (a writable
    pipe has a free page, a writable Unix socket three quarters of its send buffer, so the write
    cannot block; it asks with ``poll`` first and waits on the loop only when the wire is full);
    a longer one goes to a worker thread, as the SDK does, so a client slow to read never stalls
    the loop.
    """

    def __init__(self, fd: int) -> None:
        self._fd = fd
        # Asked first, without a trip through the event loop: the wire is nearly always writable.
        self._writable = select.poll()
        self._writable.register(fd, select.POLLOUT)

    async def write(self, text: str) -> int:
        data = text.encode("utf-8")
        if len(data) <= DIRECT_BYTES:
            if not self._writable.poll(0):  # full: wait on the loop (a POLLERR or POLLHUP is an answer too)
                await anyio.wait_writable(self._fd)
            self._write_all(data)
        else:
            await anyio.to_thread.run_sync(self._write_all, data)
        return len(text)

    def _write_all(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            view = view[os.write(self._fd, view) :]

    async def flush(self) -> None:
        """Nothing to flush, and no turn of the loop given: the writer's next receive gives one."""
