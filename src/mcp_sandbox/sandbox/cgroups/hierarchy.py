"""The cgroup filesystem as the other cgroup modules need it: mounts, our own place, pruning."""

from __future__ import annotations

import contextlib
import os
import signal
from pathlib import Path

from mcp_sandbox.sandbox import kernfs

__all__ = ["PREFIX", "kill_members", "mounts", "own_paths", "remove_everywhere", "rmdir_tree", "writable_dir"]

# Every cgroup we make is named ``mcp-sandbox-<server pid>-<hex>``: a later server sweeps by it.
PREFIX = "mcp-sandbox-"


def mounts() -> list[tuple[str, str, set[str]]]:
    """(mount point, fs type, super options) of every cgroup mount."""
    found: list[tuple[str, str, set[str]]] = []
    with contextlib.suppress(OSError), open("/proc/self/mountinfo", encoding="utf-8") as info:
        for line in info:
            left, _, right = line.partition(" - ")
            fstype, _, options = [*right.split(), "", "", ""][:3]
            if fstype in ("cgroup", "cgroup2"):
                found.append((left.split()[4], fstype, set(options.split(","))))
    return found


def own_paths() -> dict[str, str]:
    """Controller (or ``""`` for v2) -> this process's cgroup path."""
    paths: dict[str, str] = {}
    with contextlib.suppress(OSError), open("/proc/self/cgroup", encoding="utf-8") as own:
        for line in own:
            _, controllers, path = line.rstrip("\n").split(":", 2)
            for name in controllers.split(",") if controllers else [""]:
                paths[name] = path
    return paths


def writable_dir(path: Path) -> bool:
    return path.is_dir() and os.access(path, os.W_OK | os.X_OK)


def kill_members(directory: str | os.PathLike[str]) -> None:
    """SIGKILL every process in the cgroup and in its child cgroups (a container runtime's).

    The children matter on cgroup v1, which has no ``cgroup.kill``: a container start cancelled
    while podman was creating the container leaves its conmon and ``crun create`` there, waiting
    forever, and the cgroup busy.

    Raises:
        OSError: the cgroup's own list cannot be read.
    """
    for pid in kernfs.read(f"{directory}/cgroup.procs").split():
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(int(pid), signal.SIGKILL)
    children: list[str] = []
    with contextlib.suppress(OSError):
        children = kernfs.subdirectories(directory)
    for child in children:
        with contextlib.suppress(OSError):  # gone meanwhile
            kill_members(child)


def rmdir_tree(directory: str | os.PathLike[str]) -> bool:
    """rmdir a cgroup and its child cgroups, deepest first; True when it is gone. Never raises."""
    with contextlib.suppress(OSError):
        for child in kernfs.subdirectories(directory):
            rmdir_tree(child)
    try:
        os.rmdir(directory)
    except FileNotFoundError:
        return True
    except OSError:
        return False
    return True


def remove_everywhere(relative: str) -> bool:
    """Remove the cgroup ``relative`` with its (empty) children in every hierarchy; True when it is
    gone from all. Never raises.

    The children are a container runtime's: its container's and its monitor's (podman's conmon).
    """
    gone = True
    for point, _, _ in mounts():
        gone = rmdir_tree(Path(point) / relative.lstrip("/")) and gone
    return gone
