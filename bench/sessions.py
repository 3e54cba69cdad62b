"""Memory per idle session and throughput in existing conversations: sessions born of a ready sandbox or not.

Two servers over stdio (the official SDK client), in turn, ``--rounds`` times in alternation: the
default (a conversation's first run claims a session-ready sandbox, one whose runner preloaded
nothing for a first run that names no ``pool_preload`` module, as ``print(1)``) and
``session_ready=0`` (the session's sandbox started for its first run). On each, ``--sessions``
conversations are opened with ``print(1)``, ``--pause`` apart (on the default server each also
waits for an idle light session-ready sandbox: every session is born), and left idle; then each
runs the pandas script of ``run.py`` and is left idle again. After each step, the memory every
session holds: USS and PSS summed over its sandbox's processes (``/proc/<pid>/smaps_rollup``),
and its cgroup's charge (``memory.current``, or ``memory.usage_in_bytes`` on cgroup v1), medians
per session; and the growth of the server's whole process tree divided by the sessions. Then
``print(1)`` runs per second in existing conversations with 1 and 4 concurrent callers, each its
own conversation, and the CPU per run. A session's sandbox is told from the pools' by its
``/workspace``: a conversation's directory. Run as root: a sandbox's processes run as its host
uid, and bwrap's own ``/proc`` entries are root's.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import platform
import statistics
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import anyio
from first_run import PATHS, server
from mcp import Client
from run import PANDAS, call, cpu_ms, memory_of, server_pid, spent

STEPS = ("print(1)", "pandas script")
CALLERS = (1, 4)


@dataclass
class Figures:
    """One path's samples over every round: per session and step, and runs/s per round."""

    uss: dict[str, list[float]] = field(default_factory=lambda: {step: [] for step in STEPS})
    pss: dict[str, list[float]] = field(default_factory=lambda: {step: [] for step in STEPS})
    anon: dict[str, list[float]] = field(default_factory=lambda: {step: [] for step in STEPS})
    cgroup: dict[str, list[float]] = field(default_factory=lambda: {step: [] for step in STEPS})
    tree: dict[str, list[float]] = field(default_factory=lambda: {step: [] for step in STEPS})
    pools: list[tuple[int, float]] = field(default_factory=list)  # the sandboxes that are no session's: count, PSS
    born: list[int] = field(default_factory=list)  # sessions whose runner a session-ready sandbox started, per round
    rate: dict[int, list[float]] = field(default_factory=lambda: {callers: [] for callers in CALLERS})
    cpu: dict[int, list[tuple[float, float]]] = field(default_factory=lambda: {callers: [] for callers in CALLERS})


def children(pid: int) -> list[int]:
    """The children of process ``pid`` (none once it has ended)."""
    with contextlib.suppress(OSError):
        return [
            int(child)
            for task in Path(f"/proc/{pid}/task").iterdir()
            for child in (task / "children").read_text().split()
        ]
    return []


def processes(pid: int) -> list[int]:
    """``pid`` and its descendants."""
    found, pending = [], [pid]
    while pending:
        found.append(current := pending.pop())
        pending += children(current)
    return found


def workspaces_of(tree: list[int]) -> set[int]:
    """The inodes of the ``/workspace`` each process of ``tree`` (a sandbox's) sees."""
    inodes: set[int] = set()
    for process in tree:
        with contextlib.suppress(OSError):
            inodes.add(os.stat(f"/proc/{process}/root/workspace").st_ino)
    return inodes


def is_born(sandbox: int) -> bool:
    """Whether the sandbox started as ``sandbox`` is a session-ready one (a session in it was born of it)."""
    with contextlib.suppress(OSError):
        return b"--ready=" in Path(f"/proc/{sandbox}/cmdline").read_bytes()
    return False


def is_light(sandbox: int) -> bool:
    """Whether the sandbox started as ``sandbox`` is a session-ready one whose runner preloaded nothing."""
    with contextlib.suppress(OSError):
        return b"--ready=\0" in Path(f"/proc/{sandbox}/cmdline").read_bytes()
    return False


def cgroup_bytes(pid: int) -> int | None:
    """What the memory cgroup of ``pid`` is charged (None: it has none of its own)."""
    with contextlib.suppress(OSError):
        for row in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
            _, controllers, path = row.split(":", 2)
            if "memory" in controllers.split(","):
                file = Path("/sys/fs/cgroup/memory", path.lstrip("/"), "memory.usage_in_bytes")
            elif controllers == "" and Path("/sys/fs/cgroup/cgroup.controllers").exists():
                file = Path("/sys/fs/cgroup", path.lstrip("/"), "memory.current")
            else:
                continue
            return int(file.read_text()) if "mcp-sandbox-" in path else None
    return None


def take_stock(pid: int, conversations: set[int], figures: Figures, step: str, *, born: bool) -> tuple[int, int]:
    """Record the memory of each session of ``conversations`` that was (``born``) or was not born of a ready sandbox.

    Return how many sessions there are, and how many of them were born of one.
    """
    sessions = borns = others = 0
    pools = 0.0
    for sandbox in children(pid):
        uss, pss, anon = memory_of(sandbox)
        if not workspaces_of(processes(sandbox)) & conversations:
            others += 1
            pools += pss / 1024
            continue
        sessions += 1
        borns += is_born(sandbox)
        if is_born(sandbox) != born:
            continue  # on the default server, a session that came before the pool had refilled
        figures.uss[step].append(uss / 1024)
        figures.pss[step].append(pss / 1024)
        figures.anon[step].append(anon / 1024)
        if (charged := cgroup_bytes(sandbox)) is not None:
            figures.cgroup[step].append(charged / (1 << 20))
    figures.pools.append((others, pools))
    return sessions, borns


async def wait_ready(pid: int, runs: Path, bound: float = 60.0) -> None:
    """Wait (at most ``bound`` s) for an idle light session-ready sandbox (a first run of ``print(1)`` takes one):
    a runner waiting on a slot in ``runs/``."""
    with anyio.move_on_after(bound):
        while True:
            slots = {entry.inode() for entry in os.scandir(runs)}
            for sandbox in filter(is_light, children(pid)):
                tree = processes(sandbox)
                if workspaces_of(tree) & slots and len(tree) >= 3:  # bwrap twice and the runner
                    await anyio.sleep(0.5)  # its READY follows its imports
                    return
            await anyio.sleep(0.1)


async def settle(pause: float) -> None:
    await anyio.sleep(4 * pause)  # the session-ready pool's refill and the last run's teardown


async def measure(state_dir: Path, ready: str, options: argparse.Namespace, figures: Figures) -> None:
    count, pause, born = options.sessions, options.pause, ready != "0"
    env = {"MCP_SANDBOX_SESSION_TTL": "3600", "MCP_SANDBOX_MAX_SESSIONS": str(count + 8)}
    async with Client(server(state_dir, ready, **env)) as client:
        for _ in range(3):  # the first conversation wakes the session-ready pool; warm the server up
            await call(client, "print(0)", conversationId=uuid.uuid4().hex)
            await anyio.sleep(2 * pause)
        pid = server_pid()
        if pid is None:
            raise SystemExit("no `mcp-sandbox serve` child found")
        workspaces = state_dir / "workspaces"
        before = {entry.inode() for entry in os.scandir(workspaces)}  # the warm-up's conversations
        await settle(pause)
        tree = memory_of(pid)[1]
        conversations = [uuid.uuid4().hex for _ in range(count)]
        for step, code in zip(STEPS, ("print(1)", PANDAS), strict=True):
            for conversation in conversations:
                if born and step == STEPS[0]:
                    await wait_ready(pid, state_dir / "runs")
                await call(client, code, conversationId=conversation)
                await anyio.sleep(pause)
            await settle(pause)
            measured = {entry.inode() for entry in os.scandir(workspaces)} - before
            sessions, borns = take_stock(pid, measured, figures, step, born=born)
            if sessions != count:  # bwrap's /proc entries are root's
                raise RuntimeError(f"{sessions} sessions found, {count} expected (run as root)")
            figures.tree[step].append((memory_of(pid)[1] - tree) / 1024 / count)
            if step == STEPS[0]:
                figures.born.append(borns)
        await throughput(client, pid, conversations[: max(CALLERS)], options.seconds, figures)


async def throughput(client: Client, pid: int, conversations: list[str], seconds: float, figures: Figures) -> None:
    """``print(1)`` runs per second for ``seconds`` in existing conversations, one per concurrent caller."""
    for callers in CALLERS:
        done = 0
        before = cpu_ms(pid)

        async def caller(conversation: str, stop: float) -> None:
            nonlocal done
            while time.monotonic() < stop:
                await call(client, "print(1)", conversationId=conversation)
                done += 1

        started = time.monotonic()
        async with anyio.create_task_group() as group:
            for conversation in conversations[:callers]:
                group.start_soon(caller, conversation, started + seconds)
        figures.rate[callers].append(done / (time.monotonic() - started))
        after = cpu_ms(pid)
        figures.cpu[callers].append(((after[0] - before[0]) / done, spent(before[1], after[1]) / done))


def report(figures: dict[str, Figures]) -> None:
    paths = list(PATHS)
    header = f"{'from nothing':>14} {'born':>8} {'ratio':>8}"
    print(f"\n{'memory per idle session (MiB, medians)':<56}{header}")
    for step in STEPS:
        print(f"  after {step}  (n={', '.join(str(len(figures[path].pss[step])) for path in paths)})")
        for label, kind in (
            ("unique (USS)", "uss"),
            ("proportional (PSS)", "pss"),
            ("  of it anonymous", "anon"),
            ("its cgroup's charge", "cgroup"),
            ("the server's process tree's growth (PSS) per session", "tree"),
        ):
            values = [getattr(figures[path], kind)[step] for path in paths]
            if all(values):
                nothing, born = (statistics.median(samples) for samples in values)
                print(f"    {label:<56} {nothing:8.1f} {born:8.1f} {born / nothing:7.2f}x")
    pools = [statistics.median(pss for _, pss in figures[path].pools) for path in paths]
    counts = "/".join(f"{statistics.median(count for count, _ in figures[path].pools):g}" for path in paths)
    print(f"  {f'the sandboxes that are no session ({counts}): PSS in all':<58} {pools[0]:8.1f} {pools[1]:8.1f}")
    print(f"  sessions born of a ready sandbox per round: {figures[paths[0]].born} and {figures[paths[1]].born}")
    print(f"\n{'print(1) in existing conversations (runs/s, medians)':<56}{header}")
    for callers in CALLERS:
        nothing, born = (statistics.median(figures[path].rate[callers]) for path in paths)
        label = f"{callers} concurrent caller{'s' * (callers > 1)}, each in its own conversation"
        print(f"  {label:<58} {nothing:8.1f} {born:8.1f} {born / nothing:7.2f}x")
        for path in paths:
            server_ms, sandboxes_ms = (statistics.median(cpu) for cpu in zip(*figures[path].cpu[callers], strict=True))
            rates = ", ".join(f"{rate:.0f}" for rate in figures[path].rate[callers])
            print(
                f"    {path}: rounds {rates}; CPU per run: server {server_ms:.1f} ms, sandboxes {sandboxes_ms:.1f} ms"
            )


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=20, help="idle conversations per path and round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--pause", type=float, default=1.5, help="seconds between first runs (the pool refills)")
    parser.add_argument("--seconds", type=float, default=5.0, help="how long each throughput figure runs")
    options = parser.parse_args()
    if options.sessions < max(CALLERS):
        parser.error(f"--sessions: at least {max(CALLERS)}, a conversation per concurrent caller")
    print(f"{platform.platform()}, {os.cpu_count()} CPUs, Python {platform.python_version()}")
    print(f"load average before: {' '.join(f'{load:.1f}' for load in os.getloadavg())}")
    figures = {path: Figures() for path in PATHS}
    with tempfile.TemporaryDirectory(prefix="mcp-sandbox-bench-") as scratch:
        os.chmod(scratch, 0o755)
        for round_ in range(options.rounds):
            for path, ready in PATHS.items():
                await measure(Path(scratch) / f"state-{round_}-{ready}", ready, options, figures[path])
    print(f"load average after: {' '.join(f'{load:.1f}' for load in os.getloadavg())}")
    report(figures)


if __name__ == "__main__":
    anyio.run(main)
