"""mcp-sandbox beside the alternatives that run on this machine: the same workloads, one run, side by side.

    .venv/bin/python bench/alternatives.py [--rounds 6] [--repeat 5] [--peers-dir .bench-peers]

Workloads: ``print(1)``; ``import json`` and a small computation; and, for the ways of running
that have a conversation, its second run, which reads what the first left (``x = 41`` untimed,
then ``print(x + 1)``). Each round makes one call of each workload in each way of each peer, the
peers one after the other, so that a shared machine's load falls on all of them alike (the ways
whose calls take milliseconds make ``--repeat`` calls in a row, for enough samples); a first
round warms everything up and is not counted. Every answer is checked. Medians and p95 in
milliseconds, and ratios of medians of this run: against mcp-sandbox's warm run and against the
floor.

- **mcp-sandbox**: a real ``serve`` over stdio with the SDK's client (as ``run.py``): the first
  run of a new conversation, a warm run (no conversation), and a conversation's second run; idle
  sessions expire after 1 s, so that no eviction of an old one lands on a measured first run.
- **srt** (``@anthropic-ai/sandbox-runtime``, needs ``ripgrep`` and ``socat``): ``srt -c
  "python3 -I -c CODE"`` per call, with a settings file that allows no network and no writes.
  It has no conversation: each call is a new sandbox.
- **Pyodide** (the ``pyodide`` package on node, ``bench/peers/pyodide_runner.mjs``): a node
  process per call that loads Pyodide, and a run in one kept instance, the way Pyodide-based MCP
  servers keep one loaded (here its globals are kept between calls, as a conversation's).
- **docker / podman**: ``run --rm --network none`` of the project's image per call, what a
  Docker MCP server does for a call. As root, through the test suite's wrappers, the docker
  engine, when none answers, started as the tests start it (``tests/container_helpers.py``) and
  stopped after.
- **The floor**: ``bwrap`` (every namespace unshared, ``/`` read-only) around ``python3 -I -c
  CODE``; and for scale, the same interpreter with no sandbox.

The npm peers, pinned in ``bench/peers/package.json``, are installed the first time into
``--peers-dir`` (ignored by git) with npm and npm's own configuration. A peer that cannot run
here is printed with the reason and not measured. Hosted sandboxes (E2B, Daytona) cannot be
measured here: see docs/comparison.md. The first runs of mcp-sandbox's conversations come a few
seconds apart (the other peers' calls are between them), the pace of an agent, which lets its
pre-started sandboxes refill; back to back they are slower (``first_run.py``).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import platform
import shutil
import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable
from importlib.metadata import version
from pathlib import Path

import anyio
from alternatives_peers import (
    COLUMNS,
    PYTHON,
    SECOND,
    Case,
    PeerFailed,
    container_cases,
    floor_cases,
    mcp_sandbox,
    npm_version,
    prepare_peers,
    pyodide_runner,
    srt_cases,
)

REPO = Path(__file__).resolve().parents[1]


async def measure(
    cases: list[Case], rounds: int, repeat: int, failed: dict[str, str], loads: list[float]
) -> dict[tuple[str, str, str], list[float]]:
    """Each case in order, ``rounds`` + 1 times (the first not counted), a quick one ``repeat`` times; the load."""
    samples: dict[tuple[str, str, str], list[float]] = {(c.peer, c.way, c.workload): [] for c in cases}
    for round_ in range(rounds + 1):  # round 0 warms up
        for case in cases:
            for _ in range(repeat if case.quick else 1):
                if case.peer in failed:
                    break
                try:
                    if case.before is not None:
                        await case.before()
                    started = time.perf_counter()
                    output = await case.call()
                    elapsed = (time.perf_counter() - started) * 1000
                    if output != case.expected:
                        raise PeerFailed(f"printed {output!r}, not {case.expected!r}")
                except Exception as exc:  # whatever failed: the peer is reported so, not measured
                    failed[case.peer] = f"failed in round {round_} ({case.way}, {case.workload}): {exc}"
                    break
                if round_:
                    samples[case.peer, case.way, case.workload].append(elapsed)
        loads.append(os.getloadavg()[0])
    return samples


def p95(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))]


def report(samples: dict[tuple[str, str, str], list[float]], failed: dict[str, str]) -> None:
    ways = list(dict.fromkeys((peer, way) for peer, way, _ in samples if peer not in failed))
    medians = {key: statistics.median(values) for key, values in samples.items() if values}
    label_width = 46

    def table(title: str, cell: Callable[[str, str, str], str]) -> None:
        print(f"\n{title:<{label_width}}" + "".join(f"{column:>12}" for column in COLUMNS))
        for peer, way in ways:
            print(f"  {peer + ': ' + way:<{label_width - 2}}" + "".join(cell(peer, way, c) for c in COLUMNS))

    def value(peer: str, way: str, column: str, of: Callable[[list[float]], float]) -> str:
        values = samples.get((peer, way, column))
        return f"{of(values):12.1f}" if values else f"{'-':>12}"

    def ratio(peer: str, way: str, column: str, base: tuple[str, str]) -> str:
        mine, theirs = medians.get((peer, way, column)), medians.get((*base, column))
        if not (mine and theirs):
            return f"{'-':>12}"
        return f"{mine / theirs:11.2f}x" if mine < 10 * theirs else f"{mine / theirs:11.0f}x"

    table("medians (ms)", lambda p, w, c: value(p, w, c, statistics.median))
    table("p95 (ms)", lambda p, w, c: value(p, w, c, p95))
    warm = ("mcp-sandbox", "warm run (no conversation)")
    second = ("mcp-sandbox", "a conversation's 2nd run")
    table(
        "over mcp-sandbox's warm run (2nd run: its 2nd)",
        lambda p, w, c: ratio(p, w, c, second if c == SECOND else warm),
    )
    table("over the floor (bare bwrap + python)", lambda p, w, c: ratio(p, w, c, ("floor", "bare bwrap + python")))
    counts = sorted({len(values) for values in samples.values() if values})
    print(f"\nsamples per cell: {', '.join(map(str, counts))}")


def tool_version(*argv: str) -> str:
    if shutil.which(argv[0]) is None:
        return "absent"
    return subprocess.run(argv, capture_output=True, text=True, check=False).stdout.strip()


def header(peers_dir: Path) -> None:
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    print(f"{platform.platform()}, {os.cpu_count()} CPUs, Python {platform.python_version()}, {when}")
    print(f"mcp-sandbox {version('mcp-sandbox')}, mcp {version('mcp')}, node {tool_version('node', '--version')}")
    npm = ", ".join(f"{name} {npm_version(peers_dir, name)}" for name in ("@anthropic-ai/sandbox-runtime", "pyodide"))
    print(f"peers: {npm}; {tool_version('bwrap', '--version')}; {tool_version(PYTHON, '--version')} ({PYTHON})")


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=6, help="measured rounds (one call per workload and way each)")
    parser.add_argument("--repeat", type=int, default=5, help="calls a round of the ways that take milliseconds")
    parser.add_argument("--peers-dir", type=Path, default=REPO / ".bench-peers", help="where the npm peers go")
    options = parser.parse_args()
    why_npm = prepare_peers(options.peers_dir)
    header(options.peers_dir)
    if why_npm:
        print(f"npm peers: {why_npm}")
    failed: dict[str, str] = {}
    loads = [os.getloadavg()[0]]
    with tempfile.TemporaryDirectory(prefix="mcp-sandbox-bench-") as scratch_name, contextlib.ExitStack() as stack:
        scratch = Path(scratch_name)
        os.chmod(scratch, 0o755)
        async with contextlib.AsyncExitStack() as peers:
            cases = await peers.enter_async_context(mcp_sandbox(scratch / "state"))
            found: dict[str, list[Case] | str] = {"srt": srt_cases(options.peers_dir, scratch)}
            found["Pyodide"] = await peers.enter_async_context(pyodide_runner(options.peers_dir))
            for name in ("docker", "podman"):
                found[name] = stack.enter_context(container_cases(name))
            found["floor"] = floor_cases()
            for name, peer_cases in found.items():
                if isinstance(peer_cases, str):
                    failed[name] = f"cannot run here: {peer_cases}"
                else:
                    cases += peer_cases
            samples = await measure(cases, options.rounds, options.repeat, failed, loads)
    median_load = statistics.median(loads)
    print(f"load average (1 min) during the run: {min(loads):.1f} to {max(loads):.1f}, median {median_load:.1f}")
    for name, why in failed.items():
        print(f"{name}: {why}")
    report(samples, failed)


if __name__ == "__main__":
    anyio.run(main)
