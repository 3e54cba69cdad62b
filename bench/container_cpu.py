"""The CPU one container run costs, by where it is spent: the server, the CLI, the container's
cgroup (conmon, the runtime, podman's exit command), docker's daemons.

    .venv/bin/python bench/container_cpu.py [--runs N] [--backends podman,docker]

As root, on cgroup v1 with a ``cpuacct`` hierarchy (as on these machines). For each container
backend that answers (podman through ``tests/containers/podman-wrapper``, docker on the test
suite's engine, started here as the tests start it when none answers), ``print('hello')``:

- ``fresh``: a new container per run (start, runner ready, EXEC, removal), one after another;
- ``warm``: runs served by pre-started containers, each once the pool is full again, so that a
  run's count includes its container's start and removal (what every run costs in the end).

Per run (medians over N, milliseconds of CPU, user + system):

- ``server``: this process (the engine: the backend's Python, its threads);
- ``cli``: the CLI processes it started and reaped (``run``, ``rm``, the wrapper's ``sh`` and
  ``unshare``), from ``getrusage(RUSAGE_CHILDREN)``;
- ``cgroup``: the per-run cgroup the container nests in (``cpuacct.usage``, read just before the
  engine removes it): the container's processes, podman's ``conmon`` and what it starts (the
  ``podman container cleanup`` exit command), docker's ``runc init``;
- ``daemons``: dockerd and containerd (their own CPU and their reaped children's: the shims and
  ``runc``), from ``/proc/<pid>/stat``: other users of the same engine count here too;
- ``total``: their sum.

Fresh runs are counted one by one (each run's CPU is over when its container is removed); warm
runs by the difference between two moments the pool is full, over the runs between them, so the
warm medians are of windows of one run each (``--window`` runs per window).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import resource
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import anyio
from container_latency import prepared_engine  # this folder is on sys.path: the script's own

from mcp_sandbox.engine import Engine, ExecutionRequest
from mcp_sandbox.sandbox.cgroups import RunCgroup
from mcp_sandbox.workspace import remove_tree

REPO = Path(__file__).resolve().parents[1]
CPUACCT = Path("/sys/fs/cgroup/cpuacct")
DOCKER_PID = Path("/run/mcp-sandbox-tests/dockerd.pid")
TICK = 1.0 / os.sysconf("SC_CLK_TCK")
PARTS = ("server", "cli", "cgroup", "daemons")


@dataclass
class Meter:
    """Running totals of the CPU seconds of each part (see the module docstring)."""

    daemons: list[int] = field(default_factory=list)
    removed: float = 0.0  # the per-run cgroups' usage, added as each is removed

    def now(self) -> dict[str, float]:
        own = resource.getrusage(resource.RUSAGE_SELF)
        children = resource.getrusage(resource.RUSAGE_CHILDREN)
        return {
            "server": own.ru_utime + own.ru_stime,
            "cli": children.ru_utime + children.ru_stime,
            "cgroup": self.removed,
            "daemons": sum(_stat_seconds(pid) for pid in self.daemons),
        }


def _stat_seconds(pid: int) -> float:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return sum(int(value) for value in fields[11:15]) * TICK  # utime stime cutime cstime


def _docker_daemons() -> list[int]:
    try:
        dockerd = int(DOCKER_PID.read_text())
    except (OSError, ValueError):
        return []
    found = [dockerd]
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError, IndexError):
                if int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1]) == dockerd:
                    found.append(int(entry.name))  # containerd
    return found


@contextlib.contextmanager
def _counting_cgroups(meter: Meter) -> Iterator[None]:
    """Add each per-run cgroup's ``cpuacct.usage`` to ``meter`` just before the engine removes it."""
    original = RunCgroup.aremove

    async def aremove(self: RunCgroup, bound: float = 5.0) -> None:
        path = self.hierarchy_path()
        if path is not None:
            with contextlib.suppress(OSError, ValueError):
                meter.removed += int((CPUACCT / path.lstrip("/") / "cpuacct.usage").read_text()) / 1e9
        await original(self, bound)

    RunCgroup.aremove = aremove  # type: ignore[method-assign]
    try:
        yield
    finally:
        RunCgroup.aremove = original  # type: ignore[method-assign]


def _delta(before: dict[str, float], after: dict[str, float], runs: int) -> dict[str, float]:
    return {part: (after[part] - before[part]) / runs for part in PARTS}


def _row(label: str, samples: list[dict[str, float]]) -> str:
    cells = [f"{part} {statistics.median(s[part] for s in samples) * 1000:6.1f}" for part in PARTS]
    total = statistics.median(sum(s.values()) for s in samples) * 1000
    return f"{label:<16} " + "   ".join(cells) + f"   total {total:6.1f} ms   (n={len(samples)})"


async def _settled(meter: Meter, engine: Engine | None = None) -> dict[str, float]:
    """The meter once the pool (if any) is full again and nothing of ours is being torn down."""
    with anyio.fail_after(60):
        while engine is not None and engine.prestart.ready("python") < engine.prestart.size("python"):  # noqa: ASYNC110
            await anyio.sleep(0.02)
    await anyio.sleep(0.5)  # the used container's removal runs after the answer: let it end
    return meter.now()


async def _bench(name: str, cli: str, runs: int, window: int, state: Path, meter: Meter) -> None:
    engine = prepared_engine(name, {"container_runtime": cli}, state)
    if engine is None:
        return
    request = ExecutionRequest(code="print('hello')", timeout=30)

    async def run(*, warm: bool | None) -> None:
        result = await engine.execute(request)
        assert result.stdout == "hello\n" and warm in (None, result.warm), result

    await run(warm=False)  # the first sweep, caches
    fresh = []
    for _ in range(runs):
        before = await _settled(meter)
        await run(warm=False)
        fresh.append(_delta(before, await _settled(meter), 1))
    print(_row(f"{name} fresh", fresh), flush=True)
    async with engine.running():
        await run(warm=None)  # the pool starts on the first run (or with the engine)
        warm = []
        for _ in range(runs):
            before = await _settled(meter, engine)
            for _ in range(window):
                await run(warm=True)
                await _settled(meter, engine)
            warm.append(_delta(before, meter.now(), window))
        print(_row(f"{name} warm", warm), flush=True)


@contextlib.contextmanager
def _accounted() -> Iterator[None]:
    """This process in a ``cpuacct`` cgroup of its own, for the block (so that its children are counted apart)."""
    group = CPUACCT / f"mcp-sandbox-bench-{os.getpid()}"
    group.mkdir()
    (group / "cgroup.procs").write_text(str(os.getpid()))
    try:
        yield
    finally:
        (CPUACCT / "cgroup.procs").write_text(str(os.getpid()))
        group.rmdir()


def _answers(cli: str) -> bool:
    try:
        return subprocess.run([cli, "info"], capture_output=True, timeout=60, check=False).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


async def main(runs: int, window: int, backends: list[str]) -> None:
    sys.path.insert(0, str(REPO / "tests"))
    from container_helpers import docker_daemon

    state = Path(tempfile.mkdtemp(prefix="mcp-sandbox-bench-"))
    os.chmod(state, 0o711)
    meter = Meter()
    try:
        with _accounted(), _counting_cgroups(meter):
            for name in backends:
                cli = str(REPO / "tests" / "containers" / f"{name}-wrapper")
                with docker_daemon() if name == "docker" else contextlib.nullcontext() as why:
                    if why is not None or not _answers(cli):
                        print(f"{name:<8} unavailable: {why or f'`{cli} info` does not answer'}")
                        continue
                    meter.daemons = _docker_daemons() if name == "docker" else []
                    await _bench(name, cli, runs, window, state, meter)
    finally:
        remove_tree(state)


if __name__ == "__main__":
    if os.geteuid() != 0 or not (CPUACCT / "cpuacct.usage").exists():
        sys.exit("container_cpu.py: needs root and a cgroup v1 cpuacct hierarchy at /sys/fs/cgroup/cpuacct")
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=10, help="runs (warm: windows) per row")
    parser.add_argument("--window", type=int, default=1, help="warm runs per window")
    parser.add_argument("--backends", default="podman,docker", help="comma-separated: podman, docker")
    arguments = parser.parse_args()
    print(f"mcp-sandbox container CPU per run, {arguments.runs} runs per row, load {os.getloadavg()[0]:.1f}")
    anyio.run(main, arguments.runs, arguments.window, arguments.backends.split(","))
