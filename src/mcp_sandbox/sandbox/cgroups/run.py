"""One sandbox's cgroup(s): created with the run's limits, read for limit hits, killed, removed."""

from __future__ import annotations

import contextlib
import logging
import os
import time
import uuid
from pathlib import Path

import anyio

from mcp_sandbox.sandbox import kernfs
from mcp_sandbox.sandbox.cgroups.hierarchy import PREFIX, kill_members, mounts, remove_everywhere
from mcp_sandbox.sandbox.cgroups.support import CgroupSupport
from mcp_sandbox.sandbox.policy import Limits

__all__ = ["RunCgroup"]

logger = logging.getLogger(__name__)

_REMOVE_SECONDS = 5.0
_REMOVE_POLL = 0.01
_CPU_PERIOD_US = 100_000
# Page-granular accounting: a peak this close to the limit is the limit.
_PEAK_SLACK = 64 << 10
_COUNTER_BYTES = 4096  # a limit-hit counter file's whole text, read in one pread


class RunCgroup:
    """The cgroup(s) of one sandbox. Create with :meth:`create`; always :meth:`remove`."""

    def __init__(self, support: CgroupSupport, directories: dict[str, Path]) -> None:
        self._support = support
        self.directories = directories
        # A container runtime puts cgroups of its own in it (see ``backends.process.run_cgroup``).
        self.nested = False
        # The limit-hit counters' files, kept open from their first read (see events) until remove().
        self._counters: dict[str, int] = {}
        self._removed = False

    @classmethod
    def create(cls, support: CgroupSupport, limits: Limits) -> RunCgroup:
        """Make the cgroup(s) and write the limits.

        Raises:
            OSError: the cgroup filesystem refused (the caller reports it).
        """
        # The server's pid in the name lets a later server sweep what a crashed one left.
        name = f"{PREFIX}{os.getpid()}-{uuid.uuid4().hex[:12]}"
        directories: dict[str, Path] = {}
        group = cls(support, directories)
        try:
            for controller, base in support.bases.items():
                directory = base / name
                if directory not in directories.values():
                    directory.mkdir()
                directories[controller] = directory
            group.write_limits(limits)
        except BaseException:
            group.remove()
            raise
        return group

    def _write(self, controller: str, filename: str, value: str, required: bool = True) -> None:
        path = f"{self.directories[controller]}/{filename}"
        if not required and not os.path.exists(path):
            return
        kernfs.write(path, value)

    def write_limits(self, limits: Limits) -> None:
        """Write ``limits`` (memory, pids, CPU quota) into the cgroup(s).

        Raises:
            OSError: the cgroup filesystem refused.
        """
        v1 = self._support.version == 1
        if "memory" in self.directories:
            if v1:
                # No swap beyond the limit (the file exists only with swap accounting on). The
                # kernel keeps memsw >= memory at every step: a raise writes memsw first.
                order = ["memory.limit_in_bytes", "memory.memsw.limit_in_bytes"]
                if limits.memory > int(kernfs.read(f"{self.directories['memory']}/{order[0]}")):
                    order.reverse()
                for name in order:
                    self._write("memory", name, str(limits.memory), required=name == "memory.limit_in_bytes")
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

    def enable_for_children(self) -> None:
        """On cgroup v2, make the controllers available to child cgroups (a container runtime's
        nested one, which sets its own limits in them); nothing to do on v1. Only while the
        cgroup holds no process (v2's no-internal-processes rule).

        Raises:
            OSError: the cgroup filesystem refused (the caller reports it).
        """
        if self._support.version != 2:
            return
        for directory in {*self.directories.values()}:
            controllers = sorted(c for c, d in self.directories.items() if d == directory)
            (directory / "cgroup.subtree_control").write_text(" ".join(f"+{c}" for c in controllers))

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
                (oom_kills,) = _parse_counters(kernfs.read(f"{directory}/memory.oom_control"), ("oom_kill",))
                return oom_kills > 0 or int(kernfs.read(f"{directory}/memory.failcnt")) > 0
            return sum(_parse_counters(kernfs.read(f"{directory}/memory.events"), ("oom_kill", "max"))) > 0
        except (OSError, ValueError):
            return False

    def events(self) -> tuple[int, int]:
        """(memory, pids): how often the memory limit was hit (or the OOM killer acted) and a fork
        was refused, so far (counters only grow).

        Read before and after every warm run, through descriptors kept open: opening a cgroup
        file costs several times reading it, and a warm run reads three twice.
        """
        memory = pids = 0
        with contextlib.suppress(OSError, ValueError):
            directory = self.directories.get("memory")
            if directory is not None and self._support.version == 1:
                memory += int(self._counter(f"{directory}/memory.failcnt"))
                memory += _parse_counters(self._counter(f"{directory}/memory.oom_control"), ("oom_kill",))[0]
            elif directory is not None:
                memory += sum(_parse_counters(self._counter(f"{directory}/memory.events"), ("oom_kill", "max")))
        with contextlib.suppress(OSError, ValueError):
            directory = self.directories.get("pids")
            if directory is not None:
                pids = _parse_counters(self._counter(f"{directory}/pids.events"), ("max",))[0]
        return memory, pids

    def _counter(self, path: str) -> str:
        """The text of the counter file ``path``, read from the start of a descriptor opened at its first
        read (the kernel makes the text anew for each read at offset 0) and closed by :meth:`remove`.

        Raises:
            OSError: it cannot be opened or read (``ENODEV`` once the cgroup is removed).
        """
        if self._removed:
            return kernfs.read(path)
        fd = self._counters.get(path)
        if fd is None:
            fd = self._counters[path] = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        return os.pread(fd, _COUNTER_BYTES, 0).decode()

    def pids_exhausted(self) -> bool:
        """Whether a fork failed because of the pids limit."""
        directory = self.directories.get("pids")
        if directory is None:
            return False
        with contextlib.suppress(OSError, ValueError):
            return _parse_counters(kernfs.read(f"{directory}/pids.events"), ("max",))[0] > 0
        return False

    def hierarchy_path(self) -> str | None:
        """The cgroup's path from its hierarchy's root (as ``--cgroup-parent`` takes it), when it
        is the same in every controller, else None."""
        roots = {point for point, _, _ in mounts()}
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
            return int(kernfs.read(f"{directory}/{name}")) >= limit - _PEAK_SLACK
        return False

    def pids_peaked(self, limit: int) -> bool:
        """Whether the number of tasks reached ``limit`` (a fork at that point was refused)."""
        directory = self.directories.get("pids")
        if directory is None:
            return False
        with contextlib.suppress(OSError, ValueError):
            return int(kernfs.read(f"{directory}/pids.peak")) >= limit
        return False

    def kill(self) -> None:
        """SIGKILL every process still in the cgroup."""
        for directory in {*self.directories.values()}:
            kill_file = f"{directory}/cgroup.kill"  # cgroup v2, Linux 5.14 and later
            if self._support.version == 2 and os.path.exists(kill_file):
                with contextlib.suppress(OSError):
                    kernfs.write(kill_file, "1")
                continue
            with contextlib.suppress(OSError):
                kill_members(directory)

    def kill_nested(self, spare: str) -> None:
        """SIGKILL every process in the cgroups a container runtime nested in ours, but ``spare``'s.

        ``spare`` is the runtime's monitor (podman's conmon), left to see its container die.
        """
        for directory in {*self.directories.values()}:
            with contextlib.suppress(OSError):  # nothing nested (yet), or gone meanwhile
                for child in kernfs.subdirectories(directory):
                    if os.path.basename(child) == spare:
                        continue
                    kill_file = f"{child}/cgroup.kill"
                    with contextlib.suppress(OSError):
                        if self._support.version == 2 and os.path.exists(kill_file):
                            kernfs.write(kill_file, "1")
                        else:
                            kill_members(child)

    def remove(self) -> bool:
        """Try once to remove the cgroup directories; True when all are gone. Never raises.

        A cgroup is busy (EBUSY) until the kernel has reaped its last process, which can lag
        behind the death of the sandbox's outer process: see :meth:`aremove`.
        """
        self._removed = True
        while self._counters:
            os.close(self._counters.popitem()[1])
        gone = True
        relative = self.hierarchy_path() if self.nested else None
        if relative is not None:
            # A container runtime nests its own cgroups under ours in *every* hierarchy it uses
            # (cpuset, blkio, ...), creating our directory there too: remove those as well, and
            # try again (see aremove) while one is busy.
            gone = remove_everywhere(relative)
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
        self._left(bound)

    def remove_waiting(self, bound: float = _REMOVE_SECONDS) -> None:
        """:meth:`aremove` for synchronous code (the container probe): blocks for at most ``bound``."""
        deadline = time.monotonic() + bound
        while not self.remove():
            if time.monotonic() >= deadline:
                self._left(bound)
                return
            self.kill()
            time.sleep(_REMOVE_POLL)

    def _left(self, bound: float) -> None:
        logger.warning("cgroup %s still busy after %.1f s; left for the next sweep", self.directories, bound)


def _parse_counters(text: str, keys: tuple[str, ...]) -> list[int]:
    """The values of ``keys`` in the text of a flat-keyed cgroup file (0 when absent)."""
    found = dict.fromkeys(keys, 0)
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        if name in found:
            found[name] = int(value)
    return [found[key] for key in keys]
