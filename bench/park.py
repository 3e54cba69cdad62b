"""Parked sessions (issue 48): resume to first result, park CPU, server memory per parked conversation.

In one process, the whole service over the SDK's in-memory client (as ``tests/e2e``), on real
bwrap, ``session_park_after`` short so a conversation parks between calls. Three measurements:

- **resume to first result**: the wall time of a ``run_python`` call in a parked conversation
  (``session: resumed``), end to end through the tool, against the same call in a live session
  (``kept``) and in a new conversation (``new``); for small variables and for pandas imported with
  a DataFrame of about 50 MB. Calls are ``--pause`` apart so the session-ready pool refills.
- **park CPU**: one park of such a session, timed directly (``ParkedStates.park`` on the live
  interpreter): its wall time, the CPU the sandbox's processes spent (``/proc/<pid>/stat``, the
  snapshot is pickled there) and this process's (writing and signing the file); and the file's size.
- **server memory per parked conversation**: this process's resident set after ``--parked``
  conversations were opened and parked, against before (each parked conversation is a file:
  the server keeps no entry for it).

``--many N`` measures instead the issue's 1,000: N conversations, each with variables of its own,
opened and parked (at most ``--live`` sessions live at once, as a server's caps keep them), the
server's resident set per parked conversation, then each resumed once in a random order
(``--seed``) and checked: its own variables, ``session: resumed``. The resumes' times, the parked
files' sizes and how many were resumed correctly are reported.

Medians, p95 in ms. Run as root on a machine with the sandbox's runtime built (``make setup``).
"""

from __future__ import annotations

import argparse
import gc
import os
import platform
import random
import statistics
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
from mcp import Client

from mcp_sandbox.config import load_settings
from mcp_sandbox.engine.parking import PARK_VARIABLES_BYTES, ParkedStates
from mcp_sandbox.server import build_server
from mcp_sandbox.server.service import open_service
from mcp_sandbox.state import StateLayout
from mcp_sandbox.workspace import load_secret

RUNTIME = Path(__file__).resolve().parents[1] / ".runtime" / "python"
SMALL = "count, name, items = 42, 'small', list(range(100))\ntable = {'k': [1, 2, 3]}\n"
# About 50 MB of DataFrame: 6.25 million float64 in one column.
PANDAS = "import numpy as np\nimport pandas as pd\ndf = pd.DataFrame({'x': np.arange(6_250_000, dtype='float64')})\n"
USE = {"small": "print(count + len(items))", "pandas 50 MB": "print(int(df.x.sum()))"}
SETUP = {"small": SMALL, "pandas 50 MB": PANDAS}


def quantiles(samples: list[float]) -> tuple[float, float]:
    ordered = sorted(samples)
    return statistics.median(ordered), ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))]


def rss() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) << 10
    raise RuntimeError("no VmRSS")


def tree_cpu(pid: int) -> float:
    """CPU seconds of ``pid`` and its descendants (user + system)."""
    total, pending, ticks = 0.0, [pid], os.sysconf("SC_CLK_TCK")
    while pending:
        current = pending.pop()
        try:
            fields = Path(f"/proc/{current}/stat").read_text().rpartition(")")[2].split()
            total += (int(fields[11]) + int(fields[12])) / ticks
            for task in Path(f"/proc/{current}/task").iterdir():
                pending += [int(child) for child in (task / "children").read_text().split()]
        except OSError:
            continue
    return total


def parked_files(state_dir: Path) -> list[Path]:
    parked = state_dir / "parked"
    return list(parked.glob("*.state")) if parked.is_dir() else []


async def call(client: Client, code: str, conversation: str) -> tuple[float, dict[str, Any]]:
    started = time.perf_counter()
    result = await client.call_tool("run_python", {"code": code, "conversationId": conversation})
    elapsed = (time.perf_counter() - started) * 1000
    data = result.structured_content or {}
    if data.get("status") != "success":
        raise RuntimeError(f"run failed: {data}")
    return elapsed, data


async def until(condition: Callable[[], bool], bound: float = 120) -> None:
    """Poll ``condition`` until it holds (nothing to wait on: a file appears, a session ends)."""
    with anyio.fail_after(bound):
        while not condition():  # noqa: ASYNC110 - the directory has no event to wait on
            await anyio.sleep(0.02)


async def wait_parked(state_dir: Path, count: int) -> None:
    await until(lambda: len(parked_files(state_dir)) >= count)


async def resumes(state_dir: Path, samples: int, pause: float) -> dict[str, dict[str, list[float]]]:
    settings = load_settings(
        env={},
        flags={
            "state_dir": str(state_dir),
            "discover_servers": False,
            "python_runtime": str(RUNTIME),
            "session_park_after": 2.0,
        },
    )
    figures: dict[str, dict[str, list[float]]] = {kind: {"resumed": [], "kept": [], "new": []} for kind in SETUP}
    async with open_service(settings, http=False) as service, Client(build_server(service)) as client:
        for _ in range(samples):
            for kind, setup in SETUP.items():
                conversation = f"bench-{uuid.uuid4().hex}"
                await anyio.sleep(pause)
                elapsed, _ = await call(client, setup + USE[kind], conversation)
                figures[kind]["new"].append(elapsed)
                elapsed, data = await call(client, USE[kind], conversation)
                assert data["session"] == "kept", data
                figures[kind]["kept"].append(elapsed)
                await wait_parked(state_dir, 1)
                await anyio.sleep(pause)  # the ready pool refilled
                elapsed, data = await call(client, USE[kind], conversation)
                assert data["session"] == "resumed", data
                figures[kind]["resumed"].append(elapsed)
                await call(client, "pass", conversation)
                await wait_parked(state_dir, 1)  # parked again: one file at a time
                for path in parked_files(state_dir):
                    path.unlink()
    return figures


async def parks(state_dir: Path, samples: int) -> dict[str, list[tuple[float, float, float, int]]]:
    """Each park timed directly on the live interpreter: wall ms, sandbox CPU ms, server CPU ms, file bytes."""
    settings = load_settings(
        env={}, flags={"state_dir": str(state_dir), "discover_servers": False, "python_runtime": str(RUNTIME)}
    )
    layout = StateLayout.of(settings.paths, settings.sandbox, settings.workspaces)
    figures: dict[str, list[tuple[float, float, float, int]]] = {kind: [] for kind in SETUP}
    async with open_service(settings, http=False) as service, Client(build_server(service)) as client:
        parked = ParkedStates(layout, load_secret(layout.root))
        for _ in range(samples):
            for kind, setup in SETUP.items():
                conversation = f"bench-{uuid.uuid4().hex}"
                await call(client, setup, conversation)
                key = service.workspaces.key("default", conversation)
                async with service.engine._sessions.holding(key) as interpreter:
                    assert interpreter is not None
                    pid = interpreter.sandbox.pid  # type: ignore[attr-defined]
                    sandbox, server, started = tree_cpu(pid), time.process_time(), time.perf_counter()
                    why = await parked.park(key, "default", interpreter, PARK_VARIABLES_BYTES)
                    wall = (time.perf_counter() - started) * 1000
                    server_ms = (time.process_time() - server) * 1000
                    sandbox_ms = (tree_cpu(pid) - sandbox) * 1000
                assert why is None, why
                size = layout.parked_state(key).stat().st_size
                figures[kind].append((wall, sandbox_ms, server_ms, size))
                parked.discard(key)
                await service.engine.end_session(key)
    return figures


async def memory(state_dir: Path, count: int) -> tuple[int, int, int]:
    """This process's resident set before and after ``count`` conversations were opened and parked."""
    settings = load_settings(
        env={},
        flags={
            "state_dir": str(state_dir),
            "discover_servers": False,
            "python_runtime": str(RUNTIME),
            "session_park_after": 0.3,
            "max_sessions": max(16, count),
        },
    )
    async with open_service(settings, http=False) as service, Client(build_server(service)) as client:
        await call(client, SMALL, f"bench-warm-{uuid.uuid4().hex}")  # everything imported once
        await wait_parked(state_dir, 1)
        gc.collect()
        before = rss()
        for _ in range(count):
            await call(client, SMALL, f"bench-{uuid.uuid4().hex}")
        await wait_parked(state_dir, count + 1)
        await until(lambda: not service.engine.live_sessions())
        gc.collect()
        return before, rss(), len(parked_files(state_dir))


def _own(index: int) -> tuple[str, str]:
    """The variables conversation ``index`` defines, and what printing them gives back."""
    token = uuid.uuid4().hex
    return (
        f"token, number = {token!r}, {index}\nvalues = list(range({index % 97}))\ntable = {{'n': number}}\n",
        f"{token} {index} {sum(range(index % 97))} {index}\n",
    )


async def many(state_dir: Path, count: int, live: int, seed: int) -> dict[str, Any]:
    """``count`` conversations opened and parked, then each resumed in a random order and checked."""
    settings = load_settings(
        env={},
        flags={
            "state_dir": str(state_dir),
            "discover_servers": False,
            "python_runtime": str(RUNTIME),
            "session_park_after": 0.3,
        },
    )
    check = "print(token, number, sum(values), table['n'])"
    async with open_service(settings, http=False) as service, Client(build_server(service)) as client:
        await call(client, SMALL, f"bench-warm-{uuid.uuid4().hex}")  # everything imported once
        await wait_parked(state_dir, 1)
        gc.collect()
        before = rss()
        expected: dict[str, str] = {}
        for index in range(count):
            await until(lambda: len(service.engine.live_sessions()) < live, bound=600)
            conversation = f"bench-{index}-{uuid.uuid4().hex}"
            define, expected[conversation] = _own(index)
            await call(client, define, conversation)
        await wait_parked(state_dir, count + 1)
        await until(lambda: not service.engine.live_sessions(), bound=600)
        gc.collect()
        after = rss()
        sizes = [path.stat().st_size for path in parked_files(state_dir)]
        order = list(expected)
        random.Random(seed).shuffle(order)
        times: list[float] = []
        wrong: list[str] = []
        for conversation in order:
            await until(lambda: len(service.engine.live_sessions()) < live, bound=600)
            elapsed, data = await call(client, check, conversation)
            times.append(elapsed)
            if data.get("session") != "resumed" or data.get("stdout") != expected[conversation]:
                wrong.append(f"{conversation}: {data.get('session')} {data.get('stdout')!r}")
        return {"before": before, "after": after, "sizes": sizes, "times": times, "wrong": wrong}


def report_many(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory(prefix="mcp-sandbox-bench-park-") as root:
        os.chmod(root, 0o711)
        started = time.perf_counter()
        found = anyio.run(many, Path(root) / "many", args.many, args.live, args.seed)
    count, wrong = args.many, found["wrong"]
    print(
        f"\n{count} parked conversations: server memory {found['before'] / 2**20:.1f} MiB before, "
        f"{found['after'] / 2**20:.1f} MiB after: {(found['after'] - found['before']) / count / 1024:.1f} KiB each"
    )
    sizes = found["sizes"]
    print(f"parked files: {len(sizes)}, median {statistics.median(sizes) / 1024:.1f} KiB, {sum(sizes) / 2**20:.1f} MiB")
    median, p95 = quantiles(found["times"])
    print(f"resumed in a random order: {count - len(wrong)} of {count} correct; run_python {median:.1f} / {p95:.1f} ms")
    for line in wrong[:10]:
        print(f"  wrong: {line}")
    print(f"took {time.perf_counter() - started:.0f} s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=7)
    parser.add_argument("--pause", type=float, default=1.5)
    parser.add_argument("--parked", type=int, default=50)
    parser.add_argument("--many", type=int, default=0, help="only this many parked conversations, resumed")
    parser.add_argument("--live", type=int, default=8, help="with --many: at most this many sessions live")
    parser.add_argument("--seed", type=int, default=48)
    args = parser.parse_args()
    print(f"{platform.node()} · {os.cpu_count()} cores · load {os.getloadavg()[0]:.1f}")
    if args.many:
        report_many(args)
        print(f"load after: {os.getloadavg()[0]:.1f}")
        return
    with tempfile.TemporaryDirectory(prefix="mcp-sandbox-bench-park-") as root:
        os.chmod(root, 0o711)  # the sandbox uid reaches its workspaces under it
        figures = anyio.run(resumes, Path(root) / "resume", args.samples, args.pause)
        print("\nrun_python to its first result, ms (median, p95)")
        for kind, paths in figures.items():
            for path, samples in paths.items():
                median, p95 = quantiles(samples)
                print(f"  {kind:<14} {path:<8} {median:8.1f} {p95:8.1f}  n={len(samples)}")
        timed = anyio.run(parks, Path(root) / "park", args.samples)
        print("\none park, timed directly (median): wall ms, sandbox CPU ms, server CPU ms, file MB")
        for kind, rows in timed.items():
            wall, sandbox, server, size = (statistics.median(column) for column in zip(*rows, strict=True))
            print(f"  {kind:<14} {wall:8.1f} {sandbox:8.1f} {server:8.1f} {size / 1e6:8.2f}")
        before, after, count = anyio.run(memory, Path(root) / "memory", args.parked)
        print(
            f"\nserver memory: {before / 2**20:.1f} MiB before, {after / 2**20:.1f} MiB with {count} parked "
            f"conversations: {(after - before) / max(1, count) / 1024:.1f} KiB each"
        )
    print(f"load after: {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
