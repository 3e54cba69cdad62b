"""How a zygote's child tells the zygote about its run: the report pipe, then its exit as soon as it is exiting.

A pre-forked child reports on its report pipe, before it lets go of the channel, how its wait
for an EXEC ended (:data:`RUNNING` with the run's number, and the run's seccomp guard the first
time; or :data:`HUNG_UP`, :data:`REFUSED`, :data:`BROKEN`). As its last act it writes a byte to
its ending pipe, and the zygote reads its exit code from the kernel (:func:`ending`) before the
process is torn down.
"""

from __future__ import annotations

import os
import select
import struct
import time

__all__ = ["BROKEN", "HUNG_UP", "REFUSED", "RUNNING", "ending", "exit_code", "receive", "send"]

# What a pre-forked child tells the zygote before it lets go of the channel: status, run number.
_HEAD = struct.Struct("=iQ")
RUNNING, HUNG_UP, REFUSED, BROKEN = range(4)
_PF_EXITING = 0x4
_ENDING_SECONDS = 0.05  # how long a child that let go of its ending pipe may take to be seen exiting


def exit_code(status: int) -> int:
    code = os.waitstatus_to_exitcode(status)
    return 128 - code if code < 0 else code


def send(fd: int, status: int, run_id: int = 0, guard: str = "") -> None:
    """Tell the zygote how the wait for an EXEC ended (and the run's guard, when it does not know it yet)."""
    os.write(fd, _HEAD.pack(status, run_id) + guard.encode("ascii"))
    os.close(fd)


def receive(report: int) -> tuple[int, int, str]:
    """What a child reported before it ended: (status, run number, the run's guard or "");
    (BROKEN, 0, "") if nothing. The child closes the pipe as soon as it has written."""
    data = b""
    try:
        while chunk := os.read(report, 1 << 16):
            data += chunk
    finally:
        os.close(report)
    if len(data) < _HEAD.size:
        return BROKEN, 0, ""
    status, run_id = _HEAD.unpack_from(data)
    try:
        guard = data[_HEAD.size :].decode("ascii")
    except UnicodeDecodeError:
        guard = ""
    return status, run_id, guard


def ending(child: int, ending: int) -> int | None:
    """The exit code of ``child`` as soon as it is exiting, before the kernel has torn it down; None if not seen.

    The child writes to its ending pipe as its last act before ``_exit``; the code could write
    to it earlier, so the pipe only says when to look: the child's exit code is
    read from the kernel (``/proc/<pid>/stat``: exiting, its exit status set and its address
    space let go of, but not yet torn down, which takes a while with large modules mapped).
    When the child is not that far within a moment, None: the zygote waits for it.

    The kernel shows the status only while the child is dumpable (else 0), so the runtime makes
    it dumpable again as its last act. A thread of the code that races to undo that in the
    instant between can make its run's status read as 0: the code misreporting its own exit,
    which ``os._exit(0)`` does anyway; nothing of the host's bounds depends on it.
    """
    try:
        pidfd = os.pidfd_open(child)
    except OSError:
        os.close(ending)
        return None
    try:
        # Processes the run left hold the pipe too: a byte says it, not the pipe's end. The
        # pidfd says the child is gone (died, or exited without the runtime's last act).
        poller = select.poll()
        poller.register(ending, select.POLLIN)
        poller.register(pidfd, select.POLLIN)
        ready = {fd for fd, _ in poller.poll()}
    finally:
        os.close(pidfd)
        os.close(ending)
    if pidfd in ready:
        return None
    deadline = time.monotonic() + _ENDING_SECONDS
    while True:
        try:
            with open(f"/proc/{child}/stat", "rb") as stat_file:
                fields = stat_file.read().rsplit(b")", 1)[1].split()
        except OSError:
            return None
        # Field 9 is the flags, 52 the exit status, 26 the start of the code: 0 once the exiting
        # child has let go of its address space, which the kernel does after it set the exit
        # status and before it tears that space down.
        if int(fields[6]) & _PF_EXITING and len(fields) >= 50 and int(fields[23]) == 0:
            return exit_code(int(fields[49]))
        if time.monotonic() > deadline:
            return None
        time.sleep(0.0001)
