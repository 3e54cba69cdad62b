"""Which controllers this host lets us use for per-sandbox limits, and where.

In order: a writable cgroup v1 hierarchy (root on a hybrid host); our own cgroup v2 when
controllers are already enabled for its children; our own cgroup v2 when it was delegated to
us (a ``Delegate=yes`` unit: see ``delegation.py``); else a new delegated scope asked of
systemd (``systemd.py``). The last two move the server into a leaf child of that cgroup.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass, field
from pathlib import Path

from mcp_sandbox.sandbox.cgroups.delegation import LEAF, adopt, is_delegated_to_us, marked_delegated
from mcp_sandbox.sandbox.cgroups.hierarchy import mounts, own_paths, writable_dir
from mcp_sandbox.sandbox.cgroups.systemd import (
    SystemdUnavailable,
    Unit,
    own_system_unit,
    start_delegated_scope,
    unit_of,
)

__all__ = ["CgroupSupport", "detect_cgroups", "detect_root_cgroups"]

_CONTROLLERS = ("memory", "pids", "cpu")


@dataclass(frozen=True, slots=True)
class CgroupSupport:
    """What this host lets us limit. ``bases`` maps controller to the parent directory;
    ``origin`` says where that parent came from (for ``doctor``)."""

    version: int | None
    bases: dict[str, Path] = field(default_factory=dict)
    reason: str = ""
    origin: str = ""

    def enforces(self, controller: str) -> bool:
        return controller in self.bases


def _v1(found: list[tuple[str, str, set[str]]], own: dict[str, str]) -> dict[str, Path]:
    bases: dict[str, Path] = {}
    for point, fstype, options in found:
        if fstype != "cgroup":
            continue
        for controller in _CONTROLLERS:
            if controller in options and controller in own:
                base = Path(point) / own[controller].lstrip("/")
                if writable_dir(base):
                    bases[controller] = base
    return bases


def _adopted(base: Path, origin: str) -> CgroupSupport:
    """Take over the delegated ``base`` (see ``delegation.py``) and report what it gives."""
    try:
        enabled = adopt(base, _CONTROLLERS)
    except OSError as exc:
        return CgroupSupport(version=None, reason=f"cannot take over the delegated cgroup {base}: {exc}")
    missing = [c for c in _CONTROLLERS if c not in enabled]
    reason = ""
    if missing:
        reason = (
            f"the delegated cgroup {base} lacks {' '.join(missing)}: systemd delegates only what "
            "user@.service lists; as root run `systemctl edit user@.service` and add "
            "[Service] Delegate=cpu memory pids, then log in again"
        )
    bases = {c: base for c in _CONTROLLERS if c in enabled}
    return CgroupSupport(version=2 if bases else None, bases=bases, reason=reason, origin=origin)


def _own_unit() -> Unit | None:
    """Our unit, when a manager we can ask knows us (none: no bus, or we are outside its units):
    our own manager; else, not root, the system manager's unit whose cgroup is ours (a system
    service run as a user of its own, which has no user manager)."""
    with contextlib.suppress(SystemdUnavailable, ImportError, ValueError):
        return unit_of(os.getpid())
    if os.geteuid() != 0:
        with contextlib.suppress(SystemdUnavailable, ImportError, ValueError):
            return own_system_unit()
    return None


def detect_cgroups() -> CgroupSupport:
    """Find which controllers we can use for per-sandbox limits; on a systemd host with cgroup
    v2, obtain a delegated cgroup (moving this process into a leaf of it) when we have none."""
    found = mounts()
    own = own_paths()
    bases = _v1(found, own)
    if bases:
        return CgroupSupport(version=1, bases=bases)
    v2 = next((point for point, fstype, _ in found if fstype == "cgroup2"), None)
    if v2 is None or "" not in own:
        return CgroupSupport(version=None, reason="no cgroup v2 hierarchy mounted and no writable cgroup v1 one")
    base = Path(v2) / own[""].lstrip("/")
    with contextlib.suppress(OSError):
        enabled = set((base / "cgroup.subtree_control").read_text().split())
        if writable_dir(base) and enabled & set(_CONTROLLERS):
            return CgroupSupport(
                version=2, bases={c: base for c in _CONTROLLERS if c in enabled}, origin=f"own cgroup {own['']}"
            )
    if base.name == LEAF and is_delegated_to_us(base.parent):
        # Taken over already, by this process (a second backend) or by the server that started us.
        return _adopted(base.parent, origin=f"delegated cgroup {os.path.dirname(own[''])}")
    if is_delegated_to_us(base) and marked_delegated(base):
        return _adopted(base, origin=f"delegated cgroup {own['']}")
    if any(fstype == "cgroup" and set(_CONTROLLERS) & options for _, fstype, options in found):
        return CgroupSupport(
            version=None,
            reason="memory, pids and cpu are on cgroup v1 here (a hybrid hierarchy), which only root can "
            "use: run the server as root, or boot with systemd.unified_cgroup_hierarchy=1",
        )
    unit = _own_unit()
    if unit is not None and unit.delegate and is_delegated_to_us(base):
        return _adopted(base, origin=f"delegated cgroup {own['']} of {unit.name}")
    if unit is not None and unit.main_pid == os.getpid():
        # Moving a service's main process out of it would make systemd think the service ended.
        return CgroupSupport(
            version=None,
            reason=f"the server is the main process of {unit.name}, which has no Delegate=yes: add it "
            f"(`systemctl{'' if os.geteuid() == 0 or unit.control_group else ' --user'} edit {unit.name}`: "
            "[Service] Delegate=yes)",
        )
    try:
        path = start_delegated_scope()
    except SystemdUnavailable as exc:
        return CgroupSupport(version=None, reason=f"no delegated cgroup v2 subtree: {exc}")
    return _adopted(Path(v2) / path.lstrip("/"), origin=f"systemd scope {path} (Delegate=yes)")


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
