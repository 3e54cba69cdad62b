"""Removing the cgroups of servers that are gone (crashed mid-run); never a live server's."""

from __future__ import annotations

import contextlib
from pathlib import Path

from mcp_sandbox.sandbox.cgroups.hierarchy import PREFIX, kill_members, mounts, rmdir_tree
from mcp_sandbox.sandbox.cgroups.support import CgroupSupport

__all__ = ["sweep_stale", "sweep_stale_everywhere"]


def _owner_gone(directory: Path) -> bool:
    """Whether ``directory`` is named by :data:`PREFIX` for a server pid that no longer runs."""
    owner = directory.name[len(PREFIX) :].split("-", 1)[0]
    return owner.isdigit() and not Path(f"/proc/{owner}").exists()


def _ours(base: Path) -> list[Path]:
    try:
        return [p for p in base.iterdir() if p.name.startswith(PREFIX)]
    except OSError:
        return []


def sweep_stale(support: CgroupSupport) -> int:
    """Remove the cgroups of servers that are gone (crashed); return how many were removed."""
    removed = 0
    for base in {*support.bases.values()}:
        for directory in _ours(base):
            if not _owner_gone(directory):
                continue
            with contextlib.suppress(OSError):
                kill_members(directory)
                directory.rmdir()
                removed += 1
    return removed


def sweep_stale_everywhere() -> int:
    """Remove empty ``mcp-sandbox-<pid>-*`` cgroups of dead servers at every hierarchy's root.

    A container runtime creates our per-run cgroup (see
    :func:`~mcp_sandbox.sandbox.cgroups.support.detect_root_cgroups`) in hierarchies we do not
    use (cpuset, blkio, ...) too; :func:`sweep_stale` covers only ours. Returns how many went.
    """
    removed = 0
    for point, _, _ in mounts():
        for directory in _ours(Path(point)):
            if _owner_gone(directory) and rmdir_tree(directory):
                removed += 1
    return removed
