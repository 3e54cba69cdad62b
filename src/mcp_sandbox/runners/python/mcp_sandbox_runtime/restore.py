"""Bringing a zygote's sandbox back to its state before a run, or saying why it cannot.

After each run :func:`restore` kills and reaps every other process of the sandbox's pid namespace
(the zygote is a child subreaper: the run's orphans are its children); empties ``/tmp``,
``/dev/shm`` and ``/workspace``, removes their extended attributes and gives their modes back
(their owners checked); removes System V IPC objects (POSIX message queues are refused by the
seccomp filter, as they could not be found here); and checks the zygote's own resource limits,
nice value, scheduling policy, I/O priority and CPU affinity against the ones it started with
(:func:`fingerprint`): a child of the same uid could change them (``prlimit``, ``setpriority``,
``sched_setscheduler``, ``ioprio_set``; the run's seccomp guard refuses all but the first).
"""

from __future__ import annotations

import os
import re
import resource
import shutil
import signal
import stat
from typing import Any

from .kernel import libc

__all__ = ["fingerprint", "mount_points", "restore", "wiped_directories"]

_WIPED = ("/tmp", "/dev/shm", "/workspace")
_IPC_RMID = 0
_SYS_IOPRIO_GET = {"x86_64": 252, "aarch64": 31}.get(os.uname().machine, -1)
_IOPRIO_WHO_PROCESS = 1
_RLIMITS = tuple(
    getattr(resource, name) for name in sorted(dir(resource)) if name.startswith("RLIMIT_") and name != "RLIMIT_NLIMITS"
)


def _ioprio() -> int:
    """This process's I/O priority (ioprio_get; -1 where the call is unknown)."""
    return int(libc().syscall(_SYS_IOPRIO_GET, _IOPRIO_WHO_PROCESS, 0))


def fingerprint() -> tuple[Any, ...]:
    """What a child of the same uid could change about the zygote from outside."""
    return (
        tuple(resource.getrlimit(limit) for limit in _RLIMITS),
        os.getpriority(os.PRIO_PROCESS, 0),
        frozenset(os.sched_getaffinity(0)),
        os.sched_getscheduler(0),
        os.sched_getparam(0).sched_priority,
        _ioprio(),
    )


def wiped_directories() -> dict[str, tuple[int, int, int]]:
    """(mode, uid, gid) of each wiped directory, as the sandbox made it."""
    found = {}
    for directory in _WIPED:
        try:
            info = os.stat(directory, follow_symlinks=False)
        except FileNotFoundError:
            continue
        found[directory] = (stat.S_IMODE(info.st_mode), info.st_uid, info.st_gid)
    return found


def _reap_all() -> str | None:
    """Kill every process of the sandbox but this one (and its init), and reap them."""
    while True:
        try:
            os.kill(-1, signal.SIGKILL)
        except ProcessLookupError:
            pass
        try:
            os.waitpid(-1, 0)
        except ChildProcessError:
            break
    try:
        os.kill(-1, 0)
    except ProcessLookupError:
        return None
    return "a process of the run outlived it"


def _remove_entry(path: str) -> None:
    """Remove ``path`` (a tree), giving back the permissions the run may have taken from its directories."""

    def retry(function: Any, failed: str, _: Any) -> None:
        parent = os.path.dirname(failed)
        os.chmod(parent, stat.S_IRWXU)
        if os.path.isdir(failed) and not os.path.islink(failed):
            os.chmod(failed, stat.S_IRWXU)
            shutil.rmtree(failed)
        else:
            function(failed)

    if os.path.isdir(path) and not os.path.islink(path):
        os.chmod(path, stat.S_IRWXU)
        shutil.rmtree(path, onerror=retry)
    else:
        os.unlink(path)


def mount_points() -> set[str]:
    """Where something is mounted in this sandbox (a runtime under the host's /tmp is bound inside /tmp)."""
    points: set[str] = set()
    with open("/proc/self/mountinfo") as table:
        for row in table:
            field = row.split()[4]
            points.add(re.sub(r"\\([0-7]{3})", lambda match: chr(int(match.group(1), 8)), field))
    return points


def _clear(directory: str, mounts: set[str], holders: set[str]) -> None:
    """Remove what ``directory`` holds, except mount points and the directories leading to them."""
    with os.scandir(directory) as entries:
        paths = [entry.path for entry in entries]
    for path in paths:
        if path in mounts:
            continue
        if path in holders:
            _clear(path, mounts, holders)
        else:
            _remove_entry(path)


def _wipe(mounts: set[str], directories: dict[str, tuple[int, int, int]]) -> str | None:
    holders = {parent for point in mounts for parent in _parents(point)}
    for directory, (mode, uid, gid) in directories.items():
        try:
            if not os.access(directory, os.R_OK | os.W_OK | os.X_OK):  # the run took them away
                os.chmod(directory, stat.S_IRWXU | (os.stat(directory).st_mode & 0o7077))
            _clear(directory, mounts, holders)
            for name in os.listxattr(directory, follow_symlinks=False):  # a channel to the next run
                os.removexattr(directory, name, follow_symlinks=False)
            os.chmod(directory, mode, follow_symlinks=False)
            info = os.stat(directory, follow_symlinks=False)
        except (OSError, RecursionError) as error:
            return f"could not empty {directory}: {error}"
        if (stat.S_IMODE(info.st_mode), info.st_uid, info.st_gid) != (mode, uid, gid):
            return f"{directory} changed its mode or owner"
    return None


def _parents(path: str) -> list[str]:
    parents = []
    while (parent := os.path.dirname(path)) != path:
        parents.append(parent)
        path = parent
    return parents


def _remove_ipc() -> str | None:
    """Remove the System V IPC objects a run left in the sandbox's IPC namespace."""
    leftovers: list[tuple[str, int]] = []
    for kind in ("shm", "msg", "sem"):
        try:
            with open(f"/proc/sysvipc/{kind}") as table:
                rows = table.read().splitlines()[1:]
        except OSError:
            continue
        leftovers.extend((kind, int(row.split()[1])) for row in rows if row.strip())
    if not leftovers:
        return None
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    for kind, ident in leftovers:
        if kind == "shm":
            done = libc.shmctl(ident, _IPC_RMID, None)
        elif kind == "msg":
            done = libc.msgctl(ident, _IPC_RMID, None)
        else:
            done = libc.semctl(ident, 0, _IPC_RMID)
        if done != 0:
            return f"could not remove System V {kind} {ident}: {os.strerror(ctypes.get_errno())}"
    return None


def restore(baseline: tuple[Any, ...], mounts: set[str], directories: dict[str, tuple[int, int, int]]) -> str | None:
    """Bring the sandbox back to its state before the run; why not, if it cannot."""
    problem = _reap_all() or _wipe(mounts, directories) or _remove_ipc()
    if problem is None and fingerprint() != baseline:
        problem = "the run changed the zygote's limits, priorities, scheduling or CPU affinity"
    return problem
