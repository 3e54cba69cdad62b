"""A conversation's first run over MCP stdio: a session started from nothing against one born of a ready one.

Each sample is the first `run_python` call of a new `conversationId` (so a new session), end to
end over stdio with the official SDK client, on two servers run in turn, several rounds in
alternation: one with `session_ready=0` (today's path: a session's sandbox started for the
call) and one with the default (a session-ready sandbox claimed, its runner the
session's interpreter). Calls are paced (`--pause`) so the pool refills between them, and idle
sessions expire after 1 s so that no eviction falls on a measured call. Medians, p95, p99 in ms.

As root, each round also runs one HTTP server with two tenants, ``default`` (its ``token``) and a
token tenant (``alice``, its sandboxes her own host uid's), and times their born first runs end to
end over Streamable HTTP, in alternation: the token tenant's line beside ``default``'s.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import platform
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx2
from mcp import Client
from mcp.client.stdio import StdioServerParameters
from mcp.client.streamable_http import streamable_http_client

PANDAS = "import pandas as pd\ndf = pd.DataFrame({'a': range(1000)})\nprint(int(df.a.sum()))"
SCRIPTS = {"print(1)": "print(1)", "pandas script": PANDAS}
PATHS = {"from nothing": "0", "born of a ready sandbox": "2"}  # 2, the default: a preloading one and a light one
TOKENS = {"default": "default-bench-token-0123456789abcdef", "token tenant": "alice-bench-token-0123456789abcdef"}
START_BOUND = 60.0


def quantiles(samples: list[float]) -> tuple[float, float, float]:
    ordered = sorted(samples)

    def at(fraction: float) -> float:
        return ordered[min(len(ordered) - 1, round(fraction * (len(ordered) - 1)))]

    return statistics.median(ordered), at(0.95), at(0.99)


def server(state_dir: Path, ready: str, **env: str) -> StdioServerParameters:
    """``serve`` over stdio with ``session_ready`` set to ``ready``; ``env`` adds or overrides variables."""
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
            **env,
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


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


@contextlib.contextmanager
def http_server(state_dir: Path, extra: str = "") -> Iterator[str]:
    """A real ``serve --transport http`` with the two tenants of ``TOKENS`` (``extra``: more TOML); yield its URL."""
    state_dir.mkdir()
    config = state_dir.parent / f"{state_dir.name}.toml"
    alice = TOKENS["token tenant"]
    tokens = f'[auth]\ntokens = [{{ tenant = "alice", token = "{alice}" }}]\n'
    config.write_text(f'token = "{TOKENS["default"]}"\n{extra}{tokens}')
    port = free_port()
    command = [sys.executable, "-m", "mcp_sandbox", "serve", "--transport", "http", "--host", "127.0.0.1"]
    command += ["--port", str(port), "--state-dir", str(state_dir), "--config", str(config)]
    env = {name: value for name, value in os.environ.items() if not name.startswith("MCP_SANDBOX_")}
    env |= {"MCP_SANDBOX_DISCOVER_SERVERS": "false", "MCP_SANDBOX_SESSION_TTL": "1"}
    log = state_dir.parent / f"{state_dir.name}.log"
    with log.open("wb") as output:
        process = subprocess.Popen(
            command, stdin=subprocess.DEVNULL, stdout=output, stderr=output, env=env, start_new_session=True
        )
    try:
        deadline = time.monotonic() + START_BOUND
        while True:
            if process.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"the HTTP server did not start:\n{log.read_text()[-4000:]}")
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=1):
                    break
            except OSError:
                time.sleep(0.1)
        yield f"http://127.0.0.1:{port}"
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(15)
        except subprocess.TimeoutExpired:
            pass
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait(15)


@contextlib.asynccontextmanager
async def http_client(base: str, token: str) -> AsyncIterator[Client]:
    async with httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=120) as web:
        async with Client(streamable_http_client(f"{base}/mcp", http_client=web)) as client:
            yield client


async def measure_tenants(base: str, count: int, pause: float) -> dict[str, dict[str, list[float]]]:
    """Born first runs of each tenant of ``TOKENS`` over Streamable HTTP, in alternation."""
    samples: dict[str, dict[str, list[float]]] = {tenant: {label: [] for label in SCRIPTS} for tenant in TOKENS}
    async with http_client(base, TOKENS["default"]) as default, http_client(base, TOKENS["token tenant"]) as alice:
        clients = {"default": default, "token tenant": alice}
        for _ in range(3):  # each tenant's first conversation wakes its uid's session-ready pool
            for client in clients.values():
                await first_run(client, "print(0)")
            await anyio.sleep(2 * pause)
        for _ in range(count):
            for label, code in SCRIPTS.items():
                for tenant, client in clients.items():
                    samples[tenant][label].append(await first_run(client, code))
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
    tenants: dict[str, dict[str, list[float]]] = {tenant: {label: [] for label in SCRIPTS} for tenant in TOKENS}
    with tempfile.TemporaryDirectory(prefix="mcp-sandbox-bench-") as scratch:
        os.chmod(scratch, 0o755)
        for round_ in range(options.rounds):
            for path, ready in PATHS.items():
                state = Path(scratch) / f"state-{round_}-{ready}"
                for label, values in (await measure(state, ready, options.runs, options.pause)).items():
                    results[path][label].extend(values)
            if os.geteuid() == 0:  # only a root server gives a token tenant a host uid of its own
                with http_server(Path(scratch) / f"http-{round_}") as base:
                    for tenant, values_of in (await measure_tenants(base, options.runs, options.pause)).items():
                        for label, values in values_of.items():
                            tenants[tenant][label].extend(values)
    print(f"\na conversation's first run, end to end over stdio (ms){'median':>12} {'p95':>8} {'p99':>8}")
    medians: dict[tuple[str, str], float] = {}
    for label in SCRIPTS:
        for path in PATHS:
            samples = results[path][label]
            median, p95, p99 = quantiles(samples)
            medians[path, label] = median
            print(f"  {label + ', ' + path:<52} {median:8.2f} {p95:8.2f} {p99:8.2f}  n={len(samples)}")
    print("ratios (from nothing / born of a ready sandbox, medians)")
    for label in SCRIPTS:
        ratio = medians["from nothing", label] / medians["born of a ready sandbox", label]
        print(f"  {label:<52} {ratio:8.1f}x")
    if not tenants["default"]["print(1)"]:
        print("(not root: no token tenant's line, every tenant would share one uid)")
        return
    print(f"\nborn of a ready sandbox, end to end over Streamable HTTP (ms){'median':>12} {'p95':>8} {'p99':>8}")
    for label in SCRIPTS:
        for tenant in TOKENS:
            median, p95, p99 = quantiles(tenants[tenant][label])
            line = f"{label}, {tenant}" + (" (its own uid)" if tenant != "default" else "")
            print(f"  {line:<52} {median:8.2f} {p95:8.2f} {p99:8.2f}  n={len(tenants[tenant][label])}")


if __name__ == "__main__":
    anyio.run(main)
