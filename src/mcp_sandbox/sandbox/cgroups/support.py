"""Which controllers this host lets us use for per-sandbox limits, and where."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from mcp_sandbox.sandbox.cgroups.hierarchy import mounts, own_paths, writable_dir

__all__ = ["CgroupSupport", "detect_cgroups", "detect_root_cgroups"]

_CONTROLLERS = ("memory", "pids", "cpu")


@dataclass(frozen=True, slots=True)
class CgroupSupport:
    """What this host lets us limit. ``bases`` maps controller to the parent directory."""

    version: int | None
    bases: dict[str, Path] = field(default_factory=dict)
    reason: str = ""

    def enforces(self, controller: str) -> bool:
        return controller in self.bases


def detect_cgroups() -> CgroupSupport:
    """Find which controllers we can use for per-sandbox limits."""
    found = mounts()
    own = own_paths()
    bases: dict[str, Path] = {}
    for point, fstype, options in found:
        if fstype != "cgroup":
            continue
        for controller in _CONTROLLERS:
            if controller in options and controller in own:
                base = Path(point) / own[controller].lstrip("/")
                if writable_dir(base):
                    bases[controller] = base
    if bases:
        return CgroupSupport(version=1, bases=bases)
    for point, fstype, _ in found:
        if fstype != "cgroup2" or "" not in own:
            continue
        base = Path(point) / own[""].lstrip("/")
        try:
            enabled = set((base / "cgroup.subtree_control").read_text().split())
        except OSError:
            continue
        if writable_dir(base):
            bases = {c: base for c in _CONTROLLERS if c in enabled}
            if bases:
                return CgroupSupport(version=2, bases=bases)
    return CgroupSupport(
        version=None,
        reason="no writable cgroup v1 hierarchy and no delegated cgroup v2 subtree with "
        "memory/pids enabled (run as root, or under a systemd unit with Delegate=yes)",
    )


def detect_root_cgroups() -> CgroupSupport:
    """Per-run cgroups at the root of each v1 hierarchy, for nesting containers (``--cgroup-parent``).

    A container runtime takes one parent path for every controller, so ours must sit at the
    same path in each: the hierarchies' roots, where the runtime's own default parent
    (podman's ``/libpod_parent``) sits too. Needs root and cgroup v1; else no cgroups.
    """
    bases: dict[str, Path] = {}
    for point, fstype, options in mounts():
        if fstype != "cgroup":
            continue
        for controller in _CONTROLLERS:
            if controller in options and writable_dir(Path(point)):
                bases[controller] = Path(point)
    if bases:
        return CgroupSupport(version=1, bases=bases)
    return CgroupSupport(version=None, reason="no writable cgroup v1 hierarchy (needs root)")
