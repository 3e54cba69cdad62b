"""What the sandbox's first host process does between fork and exec (``preexec_fn``).

In this order: join the sandbox's cgroups (needs the server's privileges), set rlimits, drop
to the unprivileged sandbox uid/gid when the server runs as root (else bwrap, started by real
root, would map the sandbox uid to host root and files it writes would be root's), then ask
for SIGKILL when the server dies (after the uid change, which clears that setting).

Only async-signal-safe-ish work happens here: writes, setrlimit, set*id and prctl, with
everything resolved before the fork.
"""

from __future__ import annotations

import ctypes
import os
import resource
import signal
from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["LaunchSpec", "make_preexec"]

_PR_SET_PDEATHSIG = 1
_libc = ctypes.CDLL(None, use_errno=True)


@dataclass(frozen=True, slots=True)
class LaunchSpec:
    """Everything the child applies to itself before it execs the backend's binary."""

    cgroup_procs: tuple[str, ...]
    rlimits: tuple[tuple[int, int], ...]  # (resource, limit), soft == hard
    uid: int | None  # host uid to become, or None to keep ours
    gid: int | None


def make_preexec(spec: LaunchSpec) -> Callable[[], None]:
    """Build the ``preexec_fn`` for one sandbox launch."""
    parent = os.getpid()
    pid_bytes_of = str  # resolved now, not in the child

    def preexec() -> None:
        me = pid_bytes_of(os.getpid())
        for procs in spec.cgroup_procs:
            fd = os.open(procs, os.O_WRONLY)
            try:
                os.write(fd, me.encode())
            finally:
                os.close(fd)
        for which, limit in spec.rlimits:
            resource.setrlimit(which, (limit, limit))
        if spec.gid is not None:
            os.setgroups([])
            os.setresgid(spec.gid, spec.gid, spec.gid)
        if spec.uid is not None:
            os.setresuid(spec.uid, spec.uid, spec.uid)
        if _libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
        if os.getppid() != parent:  # the server died before prctl took effect
            os._exit(1)

    return preexec
