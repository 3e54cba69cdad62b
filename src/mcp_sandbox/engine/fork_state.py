"""A fork's variables on their way from its source's sandbox to its own: through a file, never whole in memory.

The source's runtime writes its variables (opaque bytes, the runtime's ``fork.py``) to its
snapshot run's stdout; the host writes what it reads of that pipe, chunk by chunk, to an unlinked
file in ``runs/`` (:class:`Spool`), each chunk reserved first against the fork's disk budgets and
none past the cap. The fork's first run gets, with its EXEC frame, the read end of a pipe the
host fills from that file while the runner reads it (:meth:`ForkState.send`: ``sendfile`` in
bounded chunks). Neither sandbox ever sees the file: the source writes into a pipe and the fork
reads from one, so nothing a hostile source leaves behind (a name, a link, a descriptor) can make
the fork read anything but what the host spooled, and no descriptor of the file is ever in a
sandbox to grow it past its reservation. The file has no name from the moment it is made (a
server that dies leaves nothing); its blocks are freed once the fork's runner has read it all, or
when the call ends, whichever comes first.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import anyio
from anyio.abc import TaskGroup

from mcp_sandbox.errors import QuotaExceededError

__all__ = ["ForkState", "Spool", "StatePipe", "spool_cap", "state_pipe"]

logger = logging.getLogger(__name__)

_SEND_CHUNK = 1 << 20
_PIPE_BYTES = 1 << 20  # the most an unprivileged process may ask (fs.pipe-max-size's default)


def spool_cap(budget: int) -> int:
    """The bytes a snapshot of ``budget`` bytes of variables may take, with room for its frame."""
    return 4 * (budget // 3) + (1 << 20)


class ForkState:
    """A fork's spooled variables: an open, unlinked file of ``size`` bytes, until :meth:`close`."""

    def __init__(self, fd: int, size: int) -> None:
        self._fd: int | None = fd
        self.size = size

    def read(self, offset: int, size: int) -> bytes:
        """Up to ``size`` bytes of the state from ``offset`` (b"" past its end, or once closed)."""
        if self._fd is None or offset >= self.size:
            return b""
        return os.pread(self._fd, min(size, self.size - offset), offset)

    def close(self) -> None:
        """Free the file's blocks. Safe to call more than once."""
        if self._fd is not None:
            fd, self._fd = self._fd, None
            os.close(fd)

    async def send(self, pipe: int) -> None:
        """Write the file into ``pipe`` (a pipe's write end; closed here) as its reader takes it, then
        close the file: the fork's runner has it all. A reader that goes away ends it early; the
        caller bounds it (it is cancelled with the run)."""
        try:
            if self._fd is None:
                return
            os.set_blocking(pipe, False)
            offset = 0
            while offset < self.size:
                try:
                    sent = os.sendfile(pipe, self._fd, offset, min(_SEND_CHUNK, self.size - offset))
                except BlockingIOError:
                    await anyio.wait_writable(pipe)
                    continue
                except BrokenPipeError:  # the runner is gone, or closed its end unread
                    return
                except OSError as exc:  # the fork's runner reads a short state, and says it could not load it
                    logger.error("could not send a fork's variables to its sandbox: %s", exc)
                    return
                if not sent:
                    return
                offset += sent
            self.close()
        finally:
            os.close(pipe)


class StatePipe:
    """The pipe a fork's first EXEC frame carries its variables in (see :func:`state_pipe`)."""

    def __init__(self, state: ForkState | None) -> None:
        self._state = state
        self._read: int | None = None
        self._write: int | None = None
        if state is not None:
            self._read, self._write = os.pipe2(os.O_CLOEXEC)
            with contextlib.suppress(OSError):  # fewer round trips through the event loop; the default where refused
                fcntl.fcntl(self._write, fcntl.F_SETPIPE_SZ, _PIPE_BYTES)

    @property
    def ends(self) -> tuple[int, ...]:
        """The descriptor the EXEC frame carries: the read end (none without variables)."""
        return () if self._read is None else (self._read,)

    def close(self) -> None:
        """Close our copy of the read end (once it was sent): the runner's is the only one."""
        if self._read is not None:
            fd, self._read = self._read, None
            os.close(fd)

    def start(self, group: TaskGroup) -> None:
        """Fill the pipe from the state's file in a task of ``group`` (which owns the write end from now on)."""
        if self._state is not None and self._write is not None:
            group.start_soon(self._state.send, self._write)
            self._write = None

    def end(self) -> None:
        """Close what is still ours."""
        self.close()
        if self._write is not None:
            fd, self._write = self._write, None
            os.close(fd)


@contextlib.contextmanager
def state_pipe(state: ForkState | None) -> Iterator[StatePipe]:
    """A fork's variables' pipe for one EXEC frame (nothing when ``state`` is None); both ends closed after."""
    pipe = StatePipe(state)
    try:
        yield pipe
    finally:
        pipe.end()


class Spool:
    """The sink of a snapshot run's stdout: written to an unlinked file of ``runs`` as it comes.

    Each chunk is reserved first (``grow``, a
    :class:`~mcp_sandbox.workspace.changes.CopyReservation`'s); what is past the cap of a snapshot
    of ``budget`` bytes of variables, or refused, is counted, not written, so the runner never
    blocks on its pipe.
    :meth:`taken` hands the file over, or closes it.

    Raises:
        OSError: the file cannot be made.
    """

    def __init__(self, runs: Path, budget: int, grow: Callable[[int], None] | None) -> None:
        path = runs / f"{os.getpid()}-fork-{uuid.uuid4().hex}"
        flags = os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        self._fd: int | None = os.open(path, flags, 0o600)
        os.unlink(path)  # nameless from now on: the fd is the file
        self.budget = budget
        self.cap = spool_cap(budget)
        self.size = 0  # written
        self.total = 0  # fed
        self.refused: QuotaExceededError | None = None
        self.failed: OSError | None = None
        self._grow = grow

    def feed(self, data: bytes) -> None:
        """Write ``data`` if it fits the cap and the budgets (a listener of the run's stdout)."""
        self.total += len(data)
        if self._fd is None or self.total > self.cap or self.refused is not None or self.failed is not None:
            return
        try:
            if self._grow is not None:
                self._grow(len(data))
        except QuotaExceededError as exc:
            self.refused = exc
            return
        view = memoryview(data)
        try:
            while view:
                view = view[os.write(self._fd, view) :]
        except OSError as exc:
            self.failed = exc
            return
        self.size += len(data)

    def close(self) -> None:
        """Free the file (unless it was taken). Safe to call more than once."""
        if self._fd is not None:
            fd, self._fd = self._fd, None
            os.close(fd)

    def taken(self, dumped: bool) -> ForkState | str:
        """The spooled variables, or why there are none; ``dumped``: the runtime said it wrote them all.

        Raises:
            QuotaExceededError: a chunk would have passed a disk budget (the file is gone).
        """
        if self.refused is not None:
            self.close()
            raise self.refused
        why: str | None = None
        if self.total > self.cap:
            why = f"their snapshot passed the fork's limit of {self.budget >> 20} MiB of variables"
        elif self.failed is not None:
            why = f"the server could not keep their snapshot ({os.strerror(self.failed.errno or 0)})"
        elif not dumped or not self.size:
            why = "the conversation forked could not dump them"
        if why is not None or self._fd is None:
            self.close()
            return why or "the conversation forked could not dump them"
        state = ForkState(self._fd, self.size)
        self._fd = None
        return state
