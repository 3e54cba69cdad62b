"""Run latency, throughput and memory: warm sandboxes against a fresh sandbox per run, and the baselines.

Everything runs for real, in one go, on this machine: `mcp-sandbox serve` over stdio with the
official SDK client (the warm pool on, then off), the engine in process for throughput and
memory, and the baselines the ratios are against. Medians, p95 and p99 in milliseconds.
See bench/README.md for what each line measures.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio
from mcp import Client
from mcp.client.stdio import StdioServerParameters

from mcp_sandbox.config import Settings, load_settings
from mcp_sandbox.engine import ExecutionRequest
from mcp_sandbox.engine.startup import backend_for, engine_for

ROOT = Path(__file__).resolve().parent.parent
FIXTURE_SERVER = ROOT / "tests" / "downstream" / "fixture_server.py"
PANDAS = "import pandas as pd\ndf = pd.DataFrame({'a': range(1000)})\nprint(int(df.a.sum()))"
NUMPY = "import numpy as np\nprint(float(np.arange(1000).sum()))"
MIB = "print('x' * ((1 << 20) - 64))"
TS = "const n: number = 6 * 7;\nconsole.log(n);"
FORK_BASELINE = """
import gc, os, statistics, time
{imports}
gc.collect(); gc.freeze()
times = []
for _ in range(200):
    started = time.perf_counter()
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)
    times.append((time.perf_counter() - started) * 1000)
print(statistics.median(times))
"""


def quantiles(samples: list[float]) -> tuple[float, float, float]:
    ordered = sorted(samples)

    def at(fraction: float) -> float:
        return ordered[min(len(ordered) - 1, round(fraction * (len(ordered) - 1)))]

    return statistics.median(ordered), at(0.95), at(0.99)


def line(label: str, samples: list[float], extra: str = "") -> float:
    median, p95, p99 = quantiles(samples)
    print(f"  {label:<44} {median:8.2f} {p95:8.2f} {p99:8.2f}  n={len(samples)}{extra}")
    return median


async def timed(call: Callable[[], Awaitable[Any]], count: int) -> list[float]:
    samples = []
    for _ in range(count):
        started = time.perf_counter()
        await call()
        samples.append((time.perf_counter() - started) * 1000)
    return samples


def settings(state_dir: Path, **flags: Any) -> Settings:
    return load_settings(env={}, flags={"state_dir": str(state_dir), "discover_servers": False, **flags})


def server_params(state_dir: Path, servers: Path, **env: str) -> StdioServerParameters:
    return StdioServerParameters(
        command=sys.executable,
        args=["-m", "mcp_sandbox", "serve", "--state-dir", str(state_dir), "--servers-config", str(servers)],
        env={"MCP_SANDBOX_DISCOVER_SERVERS": "false", **env},
    )


async def call(client: Client, code: str, *, tool: str = "run_python", **arguments: Any) -> dict[str, Any]:
    result = await client.call_tool(tool, {"code": code, **arguments})
    data: dict[str, Any] = result.structured_content or {}
    if data.get("status") != "success":
        raise RuntimeError(f"run failed: {data}")
    return data


async def over_stdio(state_dir: Path, servers: Path, *, warm: bool, count: int) -> dict[str, float]:
    """End-to-end run_python over stdio; the pool on (warm) or off (a fresh bwrap per run)."""
    env = {"MCP_SANDBOX_MAX_TOOL_CALLS": "2000"}  # the 1,000 calls in one run
    if not warm:
        env.update(MCP_SANDBOX_POOL_SIZE="0", MCP_SANDBOX_POOL_MIN="0", MCP_SANDBOX_PRESTART_SIZE="0")
    medians: dict[str, float] = {}
    async with Client(server_params(state_dir, servers, **env)) as client:
        # Let the pool start (the preloads take ~0.5 s per sandbox) before measuring.
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            await call(client, PANDAS)
        kind = "warm" if warm else "cold"
        if warm:
            medians["noop"] = line("MCP round trip: list_runners (no sandbox)", await timed(noop(client), count))
        medians["print"] = line(f"{kind}: print(1)", await timed(lambda: call(client, "print(1)"), count))
        medians["numpy"] = line(f"{kind}: numpy script", await timed(lambda: call(client, NUMPY), count // 2))
        medians["pandas"] = line(f"{kind}: pandas script", await timed(lambda: call(client, PANDAS), count // 2))
        medians["mib"] = line(f"{kind}: 1 MiB of output", await timed(lambda: call(client, MIB), count // 4))
        # TypeScript on the default runtime, bun (bench/js_latency.py compares bun and deno).
        ts = functools.partial(call, client, TS, tool="run_code", language="typescript")
        await ts()  # its sandboxes start on the first TypeScript run
        await anyio.sleep(1.0)
        medians["ts"] = line(f"{kind}: TypeScript on bun, back to back", await timed(ts, count // 4))
        medians["ts-paced"] = line(f"{kind}: TypeScript on bun, 0.1 s apart", await paced(ts, count // 4))
        if warm:
            await tool_calls(client)
            await throughput(client)
    return medians


def noop(client: Client) -> Callable[[], Awaitable[Any]]:
    async def call() -> Any:
        return await client.call_tool("list_runners", {})

    return call


async def paced(call: Callable[[], Awaitable[Any]], count: int, pause: float = 0.1) -> list[float]:
    """Like :func:`timed`, with ``pause`` seconds (not timed) between calls: an agent's pace, not a loop's."""
    samples = []
    for _ in range(count):
        await anyio.sleep(pause)
        samples += await timed(call, 1)
    return samples


async def tool_calls(client: Client) -> None:
    """Round trips from sandboxed code to the fixture server (a real stdio MCP server), timed inside the run."""
    code = """
import statistics, time
times = []
for i in range(COUNT):
    started = time.perf_counter()
    mcp_fixture.add_sync(a=i, b=1)
    times.append((time.perf_counter() - started) * 1000)
print(statistics.median(times), sorted(times)[int(0.95 * COUNT)], sorted(times)[int(0.99 * COUNT)], sum(times))
"""
    data = await call(client, code.replace("COUNT", "1000"), servers=["fixture"], timeout=120)
    median, p95, p99, total = (float(value) for value in data["stdout"].split())
    print(f"  {'tool call round trip (fixture server, stdio)':<44} {median:8.2f} {p95:8.2f} {p99:8.2f}  n=1000")
    print(f"  {'1,000 sequential tool calls in one run':<44} {total:8.0f} ms in all")
    # The peer: the official SDK client calling the same server itself, with no sandbox between.
    fixture = StdioServerParameters(command=sys.executable, args=[str(FIXTURE_SERVER)])
    async with Client(fixture) as direct:
        for index in range(50):
            await direct.call_tool("add", {"a": index, "b": 1})
        samples = await timed(lambda: direct.call_tool("add", {"a": 1, "b": 1}), 1000)
    peer = line("  peer: SDK client straight to the server", samples)
    print(f"  {'  ours over the peer':<44} {median / peer:8.2f}x  (+{median - peer:.2f} ms)")


def server_pid() -> int | None:
    """The pid of the ``mcp-sandbox serve`` child of this process (the stdio client started it)."""
    for task in Path(f"/proc/{os.getpid()}/task").iterdir():
        for child in (task / "children").read_text().split():
            with contextlib.suppress(OSError):
                if b"serve" in Path(f"/proc/{child}/cmdline").read_bytes().split(b"\0"):
                    return int(child)
    return None


def cpu_ms(pid: int) -> tuple[float, dict[tuple[int, int], float]]:
    """CPU time (user + system, ms) of process ``pid`` so far, and of each of its descendants.

    The descendants' times are keyed by (pid, start time) and each includes the children that
    process reaped: a process that ended took its time out of ``/proc`` into its parent's
    cutime/cstime (the server's own children too, under the key ``(pid, 0)``). Compare two
    samples with :func:`spent`. Each process is read after its children (its list of children
    first, then their stats, then its own): a child reaped in between is then counted twice,
    never missed.
    """
    tick = 1000 / os.sysconf("SC_CLK_TCK")

    def stat(process: int) -> list[int]:
        fields = Path(f"/proc/{process}/stat").read_text().rpartition(")")[2].split()
        return [int(value) for value in fields[11:15]] + [int(fields[19])]  # utime..cstime, starttime

    times: dict[tuple[int, int], float] = {}

    def subtree(process: int) -> None:
        try:
            children = [
                int(child)
                for task in Path(f"/proc/{process}/task").iterdir()
                for child in (task / "children").read_text().split()
            ]
        except OSError:
            return
        for child in children:
            subtree(child)
            with contextlib.suppress(OSError):
                *used, started = stat(child)
                times[child, started] = sum(used) * tick

    subtree(pid)
    utime, stime, cutime, cstime, _ = stat(pid)
    times[pid, 0] = (cutime + cstime) * tick
    return (utime + stime) * tick, times


def spent(before: dict[tuple[int, int], float], after: dict[tuple[int, int], float]) -> float:
    """What the descendants spent between two samples of :func:`cpu_ms`: a lower bound.

    A sandbox torn down meanwhile (the pool retires one after 1,000 runs, or swaps one of the
    other kind) takes its processes' time since the first sample with it (nothing reaps them:
    its pid namespace ends with them); what they had spent before it is not subtracted either.
    """
    return sum(time - before.get(key, 0.0) for key, time in after.items())


async def throughput(client: Client) -> None:
    """Fresh-state runs per second with 1, 4 and 16 concurrent callers on one stdio session,
    and the CPU time each run took in the server process and in the sandboxes (what bounds it)."""
    pid = server_pid()
    for callers in (1, 4, 16):
        done = 0
        stop = time.monotonic() + 5
        before = cpu_ms(pid) if pid is not None else (0.0, {})

        async def caller(stop: float) -> None:
            nonlocal done
            while time.monotonic() < stop:
                await call(client, "print(1)")
                done += 1

        started = time.monotonic()
        async with anyio.create_task_group() as group:
            for _ in range(callers):
                group.start_soon(caller, stop)
        rate = done / (time.monotonic() - started)
        cpu = ""
        if pid is not None and done:
            after = cpu_ms(pid)
            server, sandboxes = (after[0] - before[0]) / done, spent(before[1], after[1]) / done
            cpu = f"  CPU per run: server {server:.1f} ms, sandboxes {sandboxes:.1f} ms"
        print(f"  {f'throughput, {callers} concurrent callers':<44} {rate:8.1f} runs/s{cpu}")


def memory_of(pid: int) -> tuple[int, int, int]:
    """(USS, PSS, anonymous PSS) in KiB of process ``pid`` and its descendants.

    The rest of the PSS is file pages (the interpreter's and the modules' code), which every
    sandbox mapping them shares: one sandbox alone is charged all of them.
    """
    uss = pss = anon = 0
    pending = [pid]
    while pending:
        current = pending.pop()
        try:
            for row in Path(f"/proc/{current}/smaps_rollup").read_text().splitlines():
                key, _, value = row.partition(":")
                if key in ("Private_Clean", "Private_Dirty"):
                    uss += int(value.split()[0])
                elif key == "Pss":
                    pss += int(value.split()[0])
                elif key == "Pss_Anon":
                    anon += int(value.split()[0])
            for task in Path(f"/proc/{current}/task").iterdir():
                pending.extend(int(child) for child in (task / "children").read_text().split())
        except OSError:
            continue
    return uss, pss, anon


async def in_process(state_dir: Path) -> None:
    """Resident memory per warm sandbox, and the fork baselines inside a sandbox."""
    config = settings(state_dir, pool_size=2, pool_min=2)
    engine = engine_for(config, backend_for(config))
    engine.prepare()
    async with engine.running():
        with anyio.fail_after(60):
            while engine.pool.idle < 2:  # noqa: ASYNC110 - the pool has no event to wait on
                await anyio.sleep(0.05)
        # pool_min 2: a preloading sandbox and a light one (nothing preloaded).
        sandboxes = [await engine.pool.take(preloaded=kind) for kind in (True, False)]
        for warm in sandboxes:
            assert warm is not None
            uss, pss, anon = memory_of(getattr(warm.interpreter.sandbox, "pid"))  # noqa: B009 - bwrap's outer pid
            # Its zygote's child waiting for the next run is one of these processes: counted.
            preloaded = "+".join(config.pool.pool_preload) if warm.preloaded else ""
            print(
                f"  warm sandbox ({preloaded or 'nothing'} preloaded): "
                f"{uss / 1024:.1f} MiB unique (USS), {pss / 1024:.1f} MiB proportional (PSS), "
                f"{anon / 1024:.1f} MiB of it anonymous"
            )
            engine.pool.give_back(warm, reusable=True)
    cold = settings(state_dir, pool_size=0, pool_min=0)
    engine = engine_for(cold, backend_for(cold))
    for label, imports in (("nothing", ""), ("numpy+pandas", "import numpy, pandas")):
        result = await engine.execute(ExecutionRequest(code=FORK_BASELINE.format(imports=imports), timeout=60))
        print(f"  {f'bare fork+exit in a sandbox, {label} imported':<44} {float(result.stdout):8.2f}")


def bare_interpreter(config: Settings) -> float:
    samples = []
    for _ in range(30):
        started = time.perf_counter()
        subprocess.run([str(config.paths.python_interpreter), "-I", "-S", "-c", "pass"], check=True)
        samples.append((time.perf_counter() - started) * 1000)
    return line("bare python3 -I -S -c pass (host, no sandbox)", samples)


async def main() -> None:
    from importlib.metadata import version

    print(f"{platform.platform()}, {os.cpu_count()} CPUs, Python {platform.python_version()}")
    print(f"mcp-sandbox {version('mcp-sandbox')}, mcp {version('mcp')}")
    with tempfile.TemporaryDirectory(prefix="mcp-sandbox-bench-") as scratch:
        root = Path(scratch)
        os.chmod(root, 0o755)
        servers = root / "servers.json"
        servers.write_text(
            json.dumps({"mcpServers": {"fixture": {"command": sys.executable, "args": [str(FIXTURE_SERVER)]}}})
        )
        print(f"\n{'(ms)':<46} {'median':>8} {'p95':>8} {'p99':>8}")
        print("baselines")
        bare_interpreter(settings(root / "state"))
        await in_process(root / "state")
        print("end to end, run_python over MCP stdio")
        warm = await over_stdio(root / "state", servers, warm=True, count=200)
        cold = await over_stdio(root / "state", servers, warm=False, count=40)
        print("ratios (cold / warm medians)")
        for key, label in (
            ("print", "print(1)"),
            ("numpy", "numpy script"),
            ("pandas", "pandas script"),
            ("mib", "1 MiB output"),
            ("ts", "TypeScript on bun, back to back"),
            ("ts-paced", "TypeScript on bun, 0.1 s apart"),
        ):
            print(f"  {label:<44} {cold[key] / warm[key]:8.1f}x")
        print("warm run over the MCP round trip of a no-op tool (the floor)")
        for key, label in (("print", "print(1)"), ("pandas", "pandas script"), ("ts-paced", "TypeScript, paced")):
            print(f"  {label:<44} {warm[key] / warm['noop']:8.1f}x  (+{warm[key] - warm['noop']:.2f} ms)")


if __name__ == "__main__":
    anyio.run(main)
