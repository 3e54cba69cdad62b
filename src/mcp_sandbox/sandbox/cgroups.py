"""Per-sandbox cgroups: memory, pids and CPU limits where the host lets us set them.

Two layouts are supported:

- cgroup v1 (as root): one directory per controller under the server's own cgroup, so any
  limit the server itself runs under still applies;
- cgroup v2 with a delegated subtree: a child of the server's own cgroup whose parent already
  enables the controllers (``cgroup.subtree_control``).

The sandbox's first process joins the cgroup itself, before it execs bwrap (see
``launcher.py``), so nothing of the sandbox ever runs outside its limits.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import anyio

from mcp_sandbox.sandbox.backends.base import LimitEvents
from mcp_sandbox.sandbox.policy import Limits

__all__ = [
    "CgroupSupport",
    "RunCgroup",
    "detect_cgroups",
    "detect_root_cgroups",
    "sweep_stale",
    "sweep_stale_everywhere",
]

logger = logging.getLogger(__name__)

_CONTROLLERS = ("memory", "pids", "cpu")
_PREFIX = "mcp-sandbox-"
_REMOVE_SECONDS = 5.0
_REMOVE_POLL = 0.01
_CPU_PERIOD_US = 100_000
# Page-granular accounting: a peak this close to the limit is the limit.
_PEAK_SLACK = 64 << 10


@dataclass(frozen=True, slots=True)
class CgroupSupport:
    """What this host lets us limit. ``bases`` maps controller to the parent directory."""

    version: int | None
    bases: dict[str, Path] = field(default_factory=dict)
    reason: str = ""

    def enforces(self, controller: str) -> bool:
        return controller in self.bases


def _mounts() -> list[tuple[str, str, set[str]]]:
    """(mount point, fs type, super options) of every cgroup mount."""
    found: list[tuple[str, str, set[str]]] = []
    with contextlib.suppress(OSError), open("/proc/self/mountinfo", encoding="utf-8") as info:
        for line in info:
            left, _, right = line.partition(" - ")
            fstype, _, options = [*right.split(), "", "", ""][:3]
            if fstype in ("cgroup", "cgroup2"):
                found.append((left.split()[4], fstype, set(options.split(","))))
    return found


def _own_paths() -> dict[str, str]:
    """Controller (or ``""`` for v2) -> this process's cgroup path."""
    paths: dict[str, str] = {}
    with contextlib.suppress(OSError), open("/proc/self/cgroup", encoding="utf-8") as own:
        for line in own:
            _, controllers, path = line.rstrip("\n").split(":", 2)
            for name in controllers.split(",") if controllers else [""]:
                paths[name] = path
    return paths


def _writable_dir(path: Path) -> bool:
    return path.is_dir() and os.access(path, os.W_OK | os.X_OK)


def detect_cgroups() -> CgroupSupport:
    """Find which controllers we can use for per-sandbox limits."""
    mounts = _mounts()
    own = _own_paths()
    bases: dict[str, Path] = {}
    for point, fstype, options in mounts:
        if fstype != "cgroup":
            continue
        for controller in _CONTROLLERS:
            if controller in options and controller in own:
                base = Path(point) / own[controller].lstrip("/")
                if _writable_dir(base):
                    bases[controller] = base
    if bases:
        return CgroupSupport(version=1, bases=bases)
    for point, fstype, _ in mounts:
        if fstype != "cgroup2" or "" not in own:
            continue
        base = Path(point) / own[""].lstrip("/")
        try:
            enabled = set((base / "cgroup.subtree_control").read_text().split())
        except OSError:
            continue
        if _writable_dir(base):
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
    for point, fstype, options in _mounts():
        if fstype != "cgroup":
            continue
        for controller in _CONTROLLERS:
            if controller in options and _writable_dir(Path(point)):
                bases[controller] = Path(point)
    if bases:
        return CgroupSupport(version=1, bases=bases)
    return CgroupSupport(version=None, reason="no writable cgroup v1 hierarchy (needs root)")


class RunCgroup:
    """The cgroup(s) of one sandbox. Create with :meth:`create`; always :meth:`remove`."""

    def __init__(self, support: CgroupSupport, directories: dict[str, Path]) -> None:
        self._support = support
        self.directories = directories

    @classmethod
    def create(cls, support: CgroupSupport, limits: Limits) -> RunCgroup:
        """Make the cgroup(s) and write the limits.

        Raises:
            OSError: the cgroup filesystem refused (the caller reports it).
        """
        # The server's pid in the name lets a later server sweep what a crashed one left.
        name = f"{_PREFIX}{os.getpid()}-{uuid.uuid4().hex[:12]}"
        directories: dict[str, Path] = {}
        group = cls(support, directories)
        try:
            for controller, base in support.bases.items():
                directory = base / name
                if directory not in directories.values():
                    directory.mkdir()
                directories[controller] = directory
            group._write_limits(limits)
        except BaseException:
            group.remove()
            raise
        return group

    def _write(self, controller: str, filename: str, value: str, required: bool = True) -> None:
        path = self.directories[controller] / filename
        if not required and not path.exists():
            return
        path.write_text(value)

    def _write_limits(self, limits: Limits) -> None:
        v1 = self._support.version == 1
        if "memory" in self.directories:
            if v1:
                self._write("memory", "memory.limit_in_bytes", str(limits.memory))
                # No swap beyond the limit (the file exists only with swap accounting on).
                self._write("memory", "memory.memsw.limit_in_bytes", str(limits.memory), required=False)
            else:
                self._write("memory", "memory.max", str(limits.memory))
                self._write("memory", "memory.swap.max", "0", required=False)
        if "pids" in self.directories:
            self._write("pids", "pids.max", str(limits.pids))
        if "cpu" in self.directories:
            quota = max(1000, int(limits.cpus * _CPU_PERIOD_US))
            if v1:
                self._write("cpu", "cpu.cfs_period_us", str(_CPU_PERIOD_US))
                self._write("cpu", "cpu.cfs_quota_us", str(quota))
            else:
                self._write("cpu", "cpu.max", f"{quota} {_CPU_PERIOD_US}")

    @property
    def procs_files(self) -> tuple[str, ...]:
        """The ``cgroup.procs`` files a process writes its pid into to join."""
        return tuple(sorted({str(d / "cgroup.procs") for d in self.directories.values()}))

    def memory_exceeded(self) -> bool:
        """Whether the OOM killer acted (or an allocation failed) because of the memory limit."""
        directory = self.directories.get("memory")
        if directory is None:
            return False
        try:
            if self._support.version == 1:
                for line in (directory / "memory.oom_control").read_text().splitlines():
                    key, _, value = line.partition(" ")
                    if key == "oom_kill" and int(value) > 0:
                        return True
                return int((directory / "memory.failcnt").read_text()) > 0
            for line in (directory / "memory.events").read_text().splitlines():
                key, _, value = line.partition(" ")
                if key in ("oom_kill", "max") and int(value) > 0:
                    return True
        except (OSError, ValueError):
            return False
        return False

    def limit_events(self) -> LimitEvents:
        """How often the memory limit was hit (or the OOM killer acted) and a fork was refused, so far."""
        memory, pids = self.events()
        return LimitEvents(memory=memory, pids=pids)

    def events(self) -> tuple[int, int]:
        """(memory, pids): the counters of :meth:`limit_events`."""
        memory = pids = 0
        with contextlib.suppress(OSError, ValueError):
            directory = self.directories.get("memory")
            if directory is not None and self._support.version == 1:
                memory += int((directory / "memory.failcnt").read_text())
                memory += _counter(directory / "memory.oom_control", "oom_kill")
            elif directory is not None:
                memory += _counter(directory / "memory.events", "oom_kill") + _counter(
                    directory / "memory.events", "max"
                )
        with contextlib.suppress(OSError, ValueError):
            directory = self.directories.get("pids")
            if directory is not None:
                pids = _counter(directory / "pids.events", "max")
        return memory, pids

    def pids_exhausted(self) -> bool:
        """Whether a fork failed because of the pids limit."""
        directory = self.directories.get("pids")
        if directory is None:
            return False
        with contextlib.suppress(OSError, ValueError):
            for line in (directory / "pids.events").read_text().splitlines():
                key, _, value = line.partition(" ")
                if key == "max" and int(value) > 0:
                    return True
        return False

    def hierarchy_path(self) -> str | None:
        """The cgroup's path from its hierarchy's root (as ``--cgroup-parent`` takes it), when it
        is the same in every controller, else None."""
        roots = {point for point, _, _ in _mounts()}
        relative: set[str] = set()
        for directory in self.directories.values():
            under = [Path(p) for p in roots if directory.is_relative_to(p)]
            if not under:
                return None
            relative.add("/" + str(directory.relative_to(max(under, key=lambda p: len(p.parts)))))
        return relative.pop() if len(relative) == 1 else None

    def memory_peaked(self, limit: int) -> bool:
        """Whether usage reached ``limit``: a child cgroup (a container's) was held at its limit.

        The container's own cgroup, where the OOM kill is counted, is gone when it exits; the
        peak of its parent (ours) is not, and a child limited to ``limit`` peaks at it only when
        the kernel had to reclaim or kill.
        """
        directory = self.directories.get("memory")
        if directory is None:
            return False
        name = "memory.max_usage_in_bytes" if self._support.version == 1 else "memory.peak"
        with contextlib.suppress(OSError, ValueError):
            return int((directory / name).read_text()) >= limit - _PEAK_SLACK
        return False

    def pids_peaked(self, limit: int) -> bool:
        """Whether the number of tasks reached ``limit`` (a fork at that point was refused)."""
        directory = self.directories.get("pids")
        if directory is None:
            return False
        with contextlib.suppress(OSError, ValueError):
            return int((directory / "pids.peak").read_text()) >= limit
        return False

    def kill(self) -> None:
        """SIGKILL every process still in the cgroup."""
        for directory in {*self.directories.values()}:
            kill_file = directory / "cgroup.kill"
            if kill_file.exists():
                with contextlib.suppress(OSError):
                    kill_file.write_text("1")
                continue
            with contextlib.suppress(OSError):
                for pid in (directory / "cgroup.procs").read_text().split():
                    with contextlib.suppress(ProcessLookupError, PermissionError):
                        os.kill(int(pid), signal.SIGKILL)

    def remove(self) -> bool:
        """Try once to remove the cgroup directories; True when all are gone. Never raises.

        A cgroup is busy (EBUSY) until the kernel has reaped its last process, which can lag
        behind the death of the sandbox's outer process: see :meth:`aremove`.
        """
        gone = True
        relative = self.hierarchy_path()
        if relative is not None:
            # A container runtime nests its own cgroups under ours in *every* hierarchy it uses
            # (cpuset, blkio, ...), creating our directory there too: remove those as well.
            _remove_everywhere(relative)
        for directory in {*self.directories.values()}:
            try:
                directory.rmdir()
            except FileNotFoundError:
                continue
            except OSError:
                gone = False
        return gone

    async def aremove(self, bound: float = _REMOVE_SECONDS) -> None:
        """Kill what is left and remove the cgroup, retrying while it is busy, for at most ``bound``."""
        with anyio.move_on_after(bound):
            while not self.remove():
                self.kill()
                await anyio.sleep(_REMOVE_POLL)
            return
        logger.warning("cgroup %s still busy after %.1f s; left for the next sweep", self.directories, bound)


def _counter(path: Path, key: str) -> int:
    """The value of ``key`` in a flat-keyed cgroup file (0 when absent)."""
    for line in path.read_text().splitlines():
        name, _, value = line.partition(" ")
        if name == key:
            return int(value)
    return 0


def sweep_stale(support: CgroupSupport) -> int:
    """Remove the cgroups of servers that are gone (crashed); return how many were removed."""
    removed = 0
    for base in {*support.bases.values()}:
        try:
            candidates = [p for p in base.iterdir() if p.name.startswith(_PREFIX)]
        except OSError:
            continue
        for directory in candidates:
            owner = directory.name[len(_PREFIX) :].split("-", 1)[0]
            if not owner.isdigit() or Path(f"/proc/{owner}").exists():
                continue
            with contextlib.suppress(OSError):
                for pid in (directory / "cgroup.procs").read_text().split():
                    with contextlib.suppress(ProcessLookupError, PermissionError):
                        os.kill(int(pid), signal.SIGKILL)
                directory.rmdir()
                removed += 1
    return removed


def _rmdir_tree(directory: Path) -> bool:
    """rmdir a cgroup and its child cgroups, deepest first; True when it is gone. Never raises."""
    with contextlib.suppress(OSError):
        for child in directory.iterdir():
            if child.is_dir():
                _rmdir_tree(child)
    try:
        directory.rmdir()
    except FileNotFoundError:
        return True
    except OSError:
        return False
    return True


def _remove_everywhere(relative: str) -> None:
    """Remove the cgroup ``relative`` with its (empty) children in every hierarchy; never raises.

    The children are a container runtime's: its container's and its monitor's (podman's conmon).
    """
    for point, _, _ in _mounts():
        _rmdir_tree(Path(point) / relative.lstrip("/"))


def sweep_stale_everywhere() -> int:
    """Remove empty ``mcp-sandbox-<pid>-*`` cgroups of dead servers at every hierarchy's root.

    A container runtime creates our per-run cgroup (see :func:`detect_root_cgroups`) in
    hierarchies we do not use (cpuset, blkio, ...) too; :func:`sweep_stale` covers only ours.
    Returns how many went.
    """
    removed = 0
    for point, _, _ in _mounts():
        try:
            candidates = [p for p in Path(point).iterdir() if p.name.startswith(_PREFIX)]
        except OSError:
            continue
        for directory in candidates:
            owner = directory.name[len(_PREFIX) :].split("-", 1)[0]
            if owner.isdigit() and not Path(f"/proc/{owner}").exists() and _rmdir_tree(directory):
                removed += 1
    return removed
