"""What rootless podman needs from the host, checked before a container is tried.

An ordinary user's podman maps the container's ids onto the user's subordinate ids
(``/etc/subuid``, ``/etc/subgid``) through the setuid helpers ``newuidmap``/``newgidmap``
(Debian's ``uidmap``), and enforces ``--memory``, ``--pids-limit`` and ``--cpus`` only through
cgroup v2 controllers systemd delegated to the user (``user@UID.service``). Without them podman
fails with a message that does not say what to install or where; this says it.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
from dataclasses import dataclass
from pathlib import Path

__all__ = ["RootlessProblems", "rootless_problems"]

_CONTROLLERS = ("memory", "pids", "cpu")


def _has_range(path: Path, user: str, uid: int) -> bool:
    with contextlib.suppress(OSError):
        for line in path.read_text().splitlines():
            owner, _, rest = line.strip().partition(":")
            count = rest.partition(":")[2]
            if owner in (user, str(uid)) and count.isdigit() and int(count) >= 65536:
                return True
    return False


def _user_manager_controllers(uid: int) -> set[str] | None:
    """The controllers delegated to ``user@UID.service``, or None when there is no such cgroup."""
    path = Path(f"/sys/fs/cgroup/user.slice/user-{uid}.slice/user@{uid}.service/cgroup.controllers")
    with contextlib.suppress(OSError):
        return set(path.read_text().split())
    return None


@dataclass(frozen=True, slots=True)
class RootlessProblems:
    """What this user lacks: ``ids`` (podman cannot start a container), ``limits`` (it cannot
    enforce memory, pids and cpu limits); each item names its fix."""

    ids: tuple[str, ...] = ()
    limits: tuple[str, ...] = ()


def rootless_problems(etc: Path = Path("/etc")) -> RootlessProblems:
    """What this user lacks for rootless podman with enforced limits (nothing for root)."""
    uid = os.geteuid()
    if uid == 0:
        return RootlessProblems()
    try:
        user = pwd.getpwuid(uid).pw_name
    except KeyError:
        user = str(uid)
    problems: list[str] = []
    for kind, flag in (("subuid", "--add-subuids"), ("subgid", "--add-subgids")):
        if not _has_range(etc / kind, user, uid):
            problems.append(
                f"no subordinate {kind[3:]}s for {user} in {etc / kind} (as root: usermod {flag} 100000-165535 {user})"
            )
    problems.extend(
        f"{helper} is missing (as root: apt install uidmap)"
        for helper in ("newuidmap", "newgidmap")
        if shutil.which(helper) is None
    )
    ids, problems = tuple(problems), []
    if not Path("/sys/fs/cgroup/cgroup.controllers").exists():
        problems.append("cgroup v1: rootless podman cannot set --memory/--pids-limit/--cpus (boot with cgroup v2)")
    else:
        delegated = _user_manager_controllers(uid)
        missing = [c for c in _CONTROLLERS if delegated is not None and c not in delegated]
        if delegated is None:
            problems.append(
                f"no systemd user manager for {user} (user@{uid}.service): podman cannot enforce limits "
                f"(log in through systemd-logind, or as root: loginctl enable-linger {user})"
            )
        elif missing:
            problems.append(
                f"user@{uid}.service is not delegated {' '.join(missing)}: as root run `systemctl edit "
                "user@.service`, add [Service] Delegate=cpu memory pids, and log in again"
            )
    return RootlessProblems(ids=ids, limits=tuple(problems))
