"""A single-use container's runner, found in the per-run cgroup the container nests in, to tell its end early.

Where each container sits in a per-run cgroup of ours (see ``sandbox.py``), the engine's runtime
makes the container's own cgroup a child of it (podman: ``libpod-<id>``, beside ``conmon``, its
monitor; docker: ``<id>``). At the runner's READY, before any code ran, that cgroup holds one
process: the runner (the container's first process, which ``connect.py`` replaced by exec on
docker). From then on its end is read as a bwrap sandbox's (``backends/runner.py``): every thread
of it exiting and nothing else in the container's cgroup, so a run is answered before the
engine has torn the container down. Any other shape, or no cgroup of ours: not told early.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from pathlib import Path

from mcp_sandbox.sandbox import kernfs
from mcp_sandbox.sandbox.backends.runner import Runner, runner_of

__all__ = ["MONITOR", "ContainerRunner", "container_runner"]

MONITOR = "conmon"  # podman's monitor's cgroup, beside the container's


@dataclass(frozen=True)
class ContainerRunner:
    """The runner of one container and its cgroup's ``cgroup.procs``."""

    runner: Runner
    procs_file: str

    def ended(self) -> int | None:
        """The runner's exit status once it has ended and nothing else runs in the container; else None."""
        return self.runner.ended(self.procs_file)


def container_runner(parent: Path) -> ContainerRunner | None:
    """The lone process of the one container cgroup below ``parent`` (a run cgroup of ours); None if not so."""
    found: list[tuple[Path, list[str]]] = []
    with contextlib.suppress(OSError):
        for child in parent.iterdir():
            if child.is_dir() and child.name != MONITOR:
                procs = kernfs.read(child / "cgroup.procs").split()
                if procs:
                    found.append((child, procs))
        if len(found) == 1 and len(found[0][1]) == 1:
            directory, (pid,) = found[0]
            runner = runner_of(int(pid))
            return None if runner is None else ContainerRunner(runner, str(directory / "cgroup.procs"))
    return None
