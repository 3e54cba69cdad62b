"""The deployed path beside the headline one: issue 47's targets for a token tenant over HTTP and stdio's default.

In one run, as root (else only the stdio lines): a real ``serve`` over stdio (tenant ``default``)
and a real ``serve --transport http`` whose token tenant ``alice`` runs as a host uid of her own,
both allowing network to one domain, each driven with the official SDK client. In alternation on
the two (so that the machine's load falls on both), end to end, medians / p95 in ms:

- a conversation's first run, paced (``--pause`` between calls: the ready pools refill);
- the same, 8 new conversations back to back (each call's time; 2 s between bursts: the pools
  grow with the first burst, sized by the arrival rate, and refill between bursts);
- a conversation's first run with ``network: true`` (paced);
- a warm ``print(1)`` (no ``conversationId``: a warm sandbox), back to back; beside it the same
  runs' own figure (the result's ``durationMs``: the engine's, from the sandbox taken to its
  result) and the MCP round trip of ``list_runners``, a tool that starts no sandbox: the round
  trip's floor (what is neither is the server's own work around a run);
- throughput: ``print(1)`` runs per second with 16 concurrent callers for ``--seconds``.

Each line but throughput also gives the server process's CPU time per call (user + system, from
``/proc``), which moves far less with the machine's load than the times do. The HTTP lines also
say where the server placed their runs (``born``: a new session born of a
session-ready sandbox; ``session``: one started from nothing, or a live one; ``warm``), from the
server's ``mcp_sandbox_run_duration_seconds`` counts. Forks are ``fork.py``'s.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import os
import platform
import re
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio
import httpx2
from first_run import TOKENS, http_client, http_server, quantiles, server
from mcp import Client

DOMAIN = "example.com"  # allowed, never reached: the runs only start with network granted
BURST = 8
METRICS_TOKEN = "metrics-bench-token-0123456789abcdef"
_PATHS = re.compile(r'^mcp_sandbox_run_duration_seconds_count\{[^}]*path="(\w+)"[^}]*\} (\S+)$', re.MULTILINE)


def server_cpu(state_dir: Path) -> float:
    """The CPU time (user + system, ms) so far of the ``serve`` process whose state directory is ``state_dir``."""
    wanted = ["--state-dir", str(state_dir)]
    for entry in Path("/proc").iterdir():
        with contextlib.suppress(OSError):
            args = (entry / "cmdline").read_bytes().decode(errors="replace").split("\0")
            if any(args[i : i + 2] == wanted for i in range(len(args) - 1)):
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
                return (int(fields[11]) + int(fields[12])) * 1000 / os.sysconf("SC_CLK_TCK")
    raise RuntimeError(f"no server with the state directory {state_dir}")


async def placements(base: str | None) -> collections.Counter[str]:
    """Runs so far by the path the HTTP server placed them on (empty: no HTTP server)."""
    if base is None:
        return collections.Counter()
    async with httpx2.AsyncClient(headers={"Authorization": f"Bearer {METRICS_TOKEN}"}) as web:
        text = (await web.get(f"{base}/metrics")).text
    counts: collections.Counter[str] = collections.Counter()
    for path, count in _PATHS.findall(text):
        counts[path] += int(float(count))
    return counts


async def call(client: Client, arguments: dict[str, Any], engine: list[float] | None = None) -> float:
    """The run's round trip in ms; its own ``durationMs`` appended to ``engine`` when given."""
    started = time.perf_counter()
    result = await client.call_tool("run_python", arguments)
    elapsed = (time.perf_counter() - started) * 1000
    data: dict[str, Any] = result.structured_content or {}
    if data.get("status") != "success":
        raise RuntimeError(f"run failed: {data}")
    if engine is not None:
        engine.append(float(data["durationMs"]))
    return elapsed


def first(network: bool = False) -> dict[str, Any]:
    return {"code": "print(1)", "conversationId": uuid.uuid4().hex, **({"network": True} if network else {})}


Measure = Callable[[Client], Awaitable[list[float]]]


def paced(count: int, pause: float, network: bool = False) -> Measure:
    async def measure(client: Client) -> list[float]:
        samples = []
        for _ in range(count):
            await anyio.sleep(pause)
            samples.append(await call(client, first(network)))
        return samples

    return measure


def burst(count: int) -> Measure:
    async def measure(client: Client) -> list[float]:
        samples: list[float] = []
        for _ in range(count):
            await anyio.sleep(2.0)  # the pools refill between bursts
            samples += [await call(client, first()) for _ in range(BURST)]
        return samples

    return measure


def warm(count: int) -> Measure:
    async def measure(client: Client) -> list[float]:
        return [await call(client, {"code": "print(1)"}) for _ in range(count)]

    return measure


def engine_figure(count: int) -> Measure:
    async def measure(client: Client) -> list[float]:
        figures: list[float] = []
        for _ in range(count):
            await call(client, {"code": "print(1)"}, figures)
        return figures

    return measure


def floor(count: int) -> Measure:
    async def measure(client: Client) -> list[float]:
        samples = []
        for _ in range(count):
            started = time.perf_counter()
            await client.call_tool("list_runners", {})
            samples.append((time.perf_counter() - started) * 1000)
        return samples

    return measure


def throughput(seconds: float) -> Measure:
    async def measure(client: Client) -> list[float]:
        done = 0
        deadline = time.perf_counter() + seconds

        async def caller() -> None:
            nonlocal done
            while time.perf_counter() < deadline:
                await call(client, {"code": "print(1)"})
                done += 1

        started = time.perf_counter()
        async with anyio.create_task_group() as group:
            for _ in range(16):
                group.start_soon(caller)
        return [done / (time.perf_counter() - started)]

    return measure


@contextlib.asynccontextmanager
async def clients(scratch: Path, root: bool) -> AsyncIterator[tuple[dict[str, Client], str | None]]:
    """stdio's default tenant, and (as root) the HTTP server's token tenant; the HTTP server's URL."""
    stdio = server(scratch / "stdio", "2", MCP_SANDBOX_EGRESS_ALLOW=DOMAIN)
    async with contextlib.AsyncExitStack() as stack:
        found = {"stdio, default": await stack.enter_async_context(Client(stdio))}
        base = None
        if root:
            extra = f'egress_allow = ["{DOMAIN}"]\nmetrics_token = "{METRICS_TOKEN}"\n'
            base = stack.enter_context(http_server(scratch / "http", extra))
            found["HTTP, token tenant"] = await stack.enter_async_context(http_client(base, TOKENS["token tenant"]))
        yield found, base


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10, help="paced first runs per line and round")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--pause", type=float, default=0.5, help="seconds between paced calls")
    parser.add_argument("--warm", type=int, default=100, help="warm runs per line and round")
    parser.add_argument("--seconds", type=float, default=3.0, help="throughput: seconds per line and round")
    parser.add_argument("--only", default="", help="measure only the figures whose name contains this")
    options = parser.parse_args()
    root = os.geteuid() == 0
    print(f"{platform.platform()}, {os.cpu_count()} CPUs, Python {platform.python_version()}")
    print(f"load average {os.getloadavg()[0]:.1f} at the start")
    figures: dict[str, Measure] = {
        "first run, paced": paced(options.runs, options.pause),
        f"first run, {BURST} back to back": burst(max(2, options.runs // 3)),
        "first run, network: true": paced(options.runs, options.pause, network=True),
        "warm print(1)": warm(options.warm),
        "warm print(1), its durationMs": engine_figure(options.warm),
        "list_runners (no sandbox)": floor(options.warm),
        "throughput, 16 callers (runs/s)": throughput(options.seconds),
    }
    figures = {name: measure for name, measure in figures.items() if options.only in name}
    samples: dict[tuple[str, str], list[float]] = collections.defaultdict(list)
    cpu: dict[tuple[str, str], float] = collections.defaultdict(float)  # the server's CPU ms, per figure and path
    placed: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    with tempfile.TemporaryDirectory(prefix="mcp-sandbox-bench-") as scratch:
        os.chmod(scratch, 0o755)
        state_dirs = {"stdio, default": Path(scratch) / "stdio", "HTTP, token tenant": Path(scratch) / "http"}
        async with clients(Path(scratch), root) as (found, base):
            for client in found.values():  # wake every pool of the tenants' uids
                for _ in range(3):
                    await call(client, first())
                    await call(client, {"code": "print(0)"})
            await anyio.sleep(2)
            for _ in range(options.rounds):
                for figure, measure in figures.items():
                    for path, client in found.items():
                        before = await placements(base)
                        spent = server_cpu(state_dirs[path])
                        samples[figure, path] += await measure(client)
                        cpu[figure, path] += server_cpu(state_dirs[path]) - spent
                        if path.startswith("HTTP"):
                            placed[figure] += await placements(base) - before
    print(f"load average {os.getloadavg()[0]:.1f} at the end")
    print(f"\n(ms, end to end){'median':>49} {'p95':>8}  server CPU/call")
    for figure in figures:
        medians = []
        for path in found:
            median, p95, _ = quantiles(samples[figure, path])
            medians.append(median)
            seen = ", ".join(f"{name} {count}" for name, count in placed[figure].most_common())
            where = f"  ({seen})" if path.startswith("HTTP") and seen else ""
            count = len(samples[figure, path])
            per_call = "" if figure.startswith("throughput") else f"{cpu[figure, path] / count:8.2f}"
            print(f"  {figure + ' (' + path + ')':<55} {median:8.2f} {p95:8.2f}  {per_call:>8}  n={count}{where}")
        if len(medians) == 2:
            print(f"  {'  HTTP token tenant / stdio default':<55} {medians[1] / medians[0]:8.2f}x")
    if not root:
        print("(not root: no token tenant's lines, every tenant would share one uid)")


if __name__ == "__main__":
    sys.exit(anyio.run(main))
