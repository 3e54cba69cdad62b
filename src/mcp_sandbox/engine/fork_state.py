"""A fork's variables on their way from its source's sandbox to its own: through a file, never whole in memory.

The source's runtime writes its variables (opaque bytes, the runtime's ``fork.py``) to its
snapshot run's stdout; the host writes what it reads of that pipe, chunk by chunk, to an unlinked
file in ``runs/`` (:class:`Spool`), each chunk reserved first against the fork's disk budgets and
none past the cap. The fork's first run gets, with its EXEC frame, a read-only descriptor of that
file and the state's size (:class:`ForkState`); its runtime reads the state straight into place
(``snapshot.py``: each array's data into memory of its own, no pipe and no copy in between) and
closes the descriptor before anything of the state is unpickled, so no code of the state, nor of
the run, ever holds it. The source's sandbox never sees the file (it writes into a pipe); the
fork's cannot write to it (read-only, and a file the sandbox's uid cannot open again by its
``/proc`` link where the server runs as root), so nothing can grow it past its reservation. The
file has no name from the moment it is made (a server that dies leaves nothing); its blocks are
freed once both the host and the fork's runner have closed it.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path

from mcp_sandbox.errors import QuotaExceededError

__all__ = ["ForkState", "Spool", "spool_cap"]


def spool_cap(budget: int) -> int:
    """The bytes a snapshot of ``budget`` bytes of variables may take, with room for its frame."""
    return 4 * (budget // 3) + (1 << 20)


class ForkState:
    """A fork's spooled variables: the first ``size`` bytes of a file open read-only as ``fd``, until
    :meth:`close` (an unlinked spool, or a parked state: :mod:`.parking`)."""

    def __init__(self, fd: int, size: int) -> None:
        self._fd: int | None = fd
        self.size = size
        # The runtime may map its large buffers instead of reading them: only a parked state that the
        # server keeps, counted in its conversation's quota, for as long as the session lives (.parking).
        self.mapped = False
        # A parked state whose seal is still to be checked: whether it held, checked while the runtime
        # reads the state; the runtime loads nothing of it until told (Interpreter.run, .parking).
        self.verdict: Callable[[], Awaitable[bool]] | None = None
        # Why that check could not be made (the file could not be read): the run fails saying so.
        self.unreadable: str | None = None

    @property
    def fd(self) -> int:
        """The read-only descriptor the fork's EXEC frame carries.

        Raises:
            ValueError: it was closed.
        """
        if self._fd is None:
            raise ValueError("the fork's state was closed")
        return self._fd

    def read(self, offset: int, size: int) -> bytes:
        """Up to ``size`` bytes of the state from ``offset`` (b"" past its end, or once closed)."""
        if self._fd is None or offset >= self.size:
            return b""
        return os.pread(self._fd, min(size, self.size - offset), offset)

    def close(self) -> None:
        """Close the host's descriptor (the spool's blocks are freed once the runner closed its own).
        Safe to call more than once."""
        if self._fd is not None:
            fd, self._fd = self._fd, None
            os.close(fd)


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
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        self._fd: int | None = os.open(path, flags, 0o600)
        try:  # the descriptor the fork gets: it cannot write through it
            self._read: int | None = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            os.close(self._fd)
            raise
        finally:
            os.unlink(path)  # nameless from now on: the descriptors are the file
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
        for fd in (self._fd, self._read):
            if fd is not None:
                os.close(fd)
        self._fd = self._read = None

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
        if why is not None or self._read is None:
            self.close()
            return why or "the conversation forked could not dump them"
        state = ForkState(self._read, self.size)
        self._read = None
        self.close()
        return state
