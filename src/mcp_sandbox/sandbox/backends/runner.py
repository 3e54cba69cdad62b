"""How a single-use sandbox's runner process ended, read from /proc before the sandbox is torn down.

A single-use sandbox's runner (a JavaScript runtime) serves one run and exits. The kernel tears
its address space down before it tells anyone (bun's is large), and bwrap (or the container
engine) ends after that; the run's end is known earlier, by what the code cannot forge: every
thread of the runner has entered the kernel's exit path (``PF_EXITING`` in
``/proc/PID/task/TID/stat``) or has a SIGKILL pending (``SigPnd``: the kernel's exit of the whole
process sends one to each thread; a thread with one never returns to user space), so no code runs
in it any more, and the exit status the kernel keeps for it (the ``exit_code`` field, set before
the leader lets go of its address space: its ``vsize`` reads 0 from then on).

The runner is found when it says READY, before any code ran: under bwrap the one process below
bwrap's own two (``bwrap -> bwrap (pid 1 inside) -> runner``, :func:`find_runner`); in a
container the lone process of the container's cgroup (see the container backend). Its start time
guards against a reused pid. A sandbox with any other process in its cgroup (the code started
one: it may still write the run's output) is not judged early.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass

from mcp_sandbox.sandbox import kernfs

__all__ = ["Runner", "find_runner", "runner_of"]

_PF_EXITING = 0x4
# Fields of /proc/PID/stat after the command's closing parenthesis (0-based): state, flags,
# starttime, vsize and exit_code (see proc(5): fields 3, 9, 22, 23 and 52).
_STATE, _FLAGS, _START, _VSIZE, _EXIT_CODE = 0, 6, 19, 20, 49
_SIGKILL_BIT = 1 << (9 - 1)
# bwrap's outer process and its pid 1 inside, besides the runner.
_BWRAP_PROCESSES = 2


@dataclass(frozen=True)
class Runner:
    """The runner process of one sandbox: its host pid and start time, and the sandbox's own
    processes that may share its cgroup (bwrap's two; none in a container's)."""

    pid: int
    start: int
    bwrap: frozenset[int]

    def ended(self, procs_file: str) -> int | None:
        """The runner's exit status as bwrap reports it, once every thread of it is exiting; else None.

        None too when another process is in the sandbox's cgroup (``procs_file``), or the runner
        cannot be read as expected (the caller then waits for the whole sandbox to end).
        """
        try:
            leader = _stat(self.pid, self.pid)
            # The kernel sets exit_code after PF_EXITING, but before it lets go of the address
            # space (vsize reads 0 from then on, while the space is still being torn down).
            if leader is None or int(leader[_START]) != self.start:
                return None
            if not _exiting(leader) or int(leader[_VSIZE]) != 0:
                return None  # the common case while it runs: one small read
            if not {int(pid) for pid in kernfs.read(procs_file).split()} <= {*self.bwrap, self.pid}:
                return None
            for task in os.listdir(f"/proc/{self.pid}/task"):
                tid = int(task)
                fields = _stat(self.pid, tid)
                if fields is not None and not _exiting(fields) and not _killed(self.pid, tid):
                    return None
            return _returncode(int(leader[_EXIT_CODE]))
        except (OSError, ValueError, IndexError):
            return None


def runner_of(pid: int) -> Runner | None:
    """Process ``pid`` as a sandbox's lone runner (nothing else may share its cgroup); None if it is gone."""
    with contextlib.suppress(OSError, ValueError, IndexError):
        fields = _stat(pid, pid)
        if fields is not None:
            return Runner(pid, int(fields[_START]), frozenset())
    return None


def find_runner(bwrap_pid: int) -> Runner | None:
    """The runner below bwrap's outer process ``bwrap_pid`` (a chain of two bwraps, then it); None if not so."""
    pid = bwrap_pid
    bwrap: set[int] = set()
    with contextlib.suppress(OSError, ValueError, IndexError):
        for _ in range(_BWRAP_PROCESSES):
            bwrap.add(pid)
            children = kernfs.read(f"/proc/{pid}/task/{pid}/children").split()
            if len(children) != 1:
                return None
            pid = int(children[0])
        fields = _stat(pid, pid)
        if fields is not None:
            return Runner(pid, int(fields[_START]), frozenset(bwrap))
    return None


def _stat(pid: int, tid: int) -> list[str] | None:
    """The fields of a task's stat after its command; None if it is gone."""
    try:
        fd = os.open(f"/proc/{pid}/task/{tid}/stat", os.O_RDONLY)
    except FileNotFoundError:
        return None
    try:
        text = os.read(fd, 4096)
    finally:
        os.close(fd)
    return text[text.rindex(b")") + 2 :].decode().split()


def _exiting(fields: list[str]) -> bool:
    return fields[_STATE] in ("Z", "X") or int(fields[_FLAGS]) & _PF_EXITING != 0


def _killed(pid: int, tid: int) -> bool:
    """Whether the thread has a SIGKILL pending (it will not run user code again); False if it is gone."""
    try:
        status = kernfs.read(f"/proc/{pid}/task/{tid}/status")
    except FileNotFoundError:
        return True
    for line in status.splitlines():
        if line.startswith("SigPnd:"):
            return int(line.split()[1], 16) & _SIGKILL_BIT != 0
    return False


def _returncode(status: int) -> int:
    """A wait status as bwrap passes it on: the exit code, or 128 + the signal that killed it."""
    signal = status & 0x7F
    return 128 + signal if signal else (status >> 8) & 0xFF
