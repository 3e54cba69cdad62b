"""A conversation's first run over MCP stdio: a session started from nothing against one born of a zygote.

Each sample is the first `run_python` call of a new `conversationId` (so a new session), end to
end over stdio with the official SDK client, on two servers run in turn, several rounds in
alternation: one with `session_ready=0` (today's path: a session's sandbox started for the
call) and one with the default (a session-ready sandbox claimed, its zygote's child the
session's interpreter). Calls are paced (`--pause`) so the pool refills between them, and idle
sessions expire after 1 s so that no eviction falls on a measured call. Medians, p95, p99 in ms.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import anyio
from mcp import Client
from mcp.client.stdio import StdioServerParameters

PANDAS = "import pandas as pd\ndf = pd.DataFrame({'a': range(1000)})\nprint(int(df.a.sum()))"
SCRIPTS = {"print(1)": "print(1)", "pandas script": PANDAS}
PATHS = {"from nothing": "0", "born of a zygote": "1"}


def quantiles(samples: list[float]) -> tuple[float, float, float]:
    ordered = sorted(samples)

    def at(fraction: float) -> float:
        return ordered[min(len(ordered) - 1, round(fraction * (len(ordered) - 1)))]

    return statistics.median(ordered), at(0.95), at(0.99)


def server(state_dir: Path, ready: str) -> StdioServerParameters:
    return StdioServerParameters(
        command=sys.executable,
        args=["-m", "mcp_sandbox", "serve", "--state-dir", str(state_dir)],
        env={
            "MCP_SANDBOX_DISCOVER_SERVERS": "false",
            "MCP_SANDBOX_SESSION_READY": ready,
            "MCP_SANDBOX_SESSION_TTL": "1",
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            # The sources under test, when given (the SDK passes only a few variables on).
            **{name: os.environ[name] for name in ("PYTHONPATH",) if name in os.environ},
        },
    )


async def first_run(client: Client, code: str) -> float:
    started = time.perf_counter()
    result = await client.call_tool("run_python", {"code": code, "conversationId": uuid.uuid4().hex})
    elapsed = (time.perf_counter() - started) * 1000
    data: dict[str, Any] = result.structured_content or {}
    if data.get("status") != "success":
        raise RuntimeError(f"run failed: {data}")
    return elapsed


async def measure(state_dir: Path, ready: str, count: int, pause: float) -> dict[str, list[float]]:
    samples: dict[str, list[float]] = {label: [] for label in SCRIPTS}
    async with Client(server(state_dir, ready)) as client:
        for _ in range(3):  # the first conversation wakes the session-ready pool; warm the server up
            await first_run(client, "print(0)")
            await anyio.sleep(2 * pause)
        for _ in range(count):
            for label, code in SCRIPTS.items():
                samples[label].append(await first_run(client, code))
                await anyio.sleep(pause)
    return samples


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10, help="first runs per script, path and round")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--pause", type=float, default=1.5, help="seconds between calls (the pool refills)")
    options = parser.parse_args()
    print(f"{platform.platform()}, {os.cpu_count()} CPUs, Python {platform.python_version()}")
    results: dict[str, dict[str, list[float]]] = {path: {label: [] for label in SCRIPTS} for path in PATHS}
    with tempfile.TemporaryDirectory(prefix="mcp-sandbox-bench-") as scratch:
        os.chmod(scratch, 0o755)
        for round_ in range(options.rounds):
            for path, ready in PATHS.items():
                state = Path(scratch) / f"state-{round_}-{ready}"
                for label, values in (await measure(state, ready, options.runs, options.pause)).items():
                    results[path][label].extend(values)
    print(f"\na conversation's first run, end to end over stdio (ms){'median':>12} {'p95':>8} {'p99':>8}")
    medians: dict[tuple[str, str], float] = {}
    for label in SCRIPTS:
        for path in PATHS:
            samples = results[path][label]
            median, p95, p99 = quantiles(samples)
            medians[path, label] = median
            print(f"  {label + ', ' + path:<52} {median:8.2f} {p95:8.2f} {p99:8.2f}  n={len(samples)}")
    print("ratios (from nothing / born of a zygote, medians)")
    for label in SCRIPTS:
        ratio = medians["from nothing", label] / medians["born of a zygote", label]
        print(f"  {label:<52} {ratio:8.1f}x")


if __name__ == "__main__":
    anyio.run(main)
