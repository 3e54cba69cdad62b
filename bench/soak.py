"""Soak: 8 clients of two tenants run a mix of work against one HTTP server for minutes.

A real ``mcp-sandbox serve --transport http`` on a free loopback port, with a config file that
gives two tenants (alice, bob) a token each, and a temporary state directory. Each client speaks
plain JSON-RPC over HTTP (stateless ``tools/call``, ``Accept: application/json``) and loops over a
warm Python run, a run in its own conversation that keeps a variable, a TypeScript run and an
upload into its conversation; every tenth round adds a run that times out and one that raises.
Prints runs/s, p50/p99 latency and errors per kind, and the server's RSS, open descriptors and
threads after warm-up, every ``--sample-every`` seconds and at the end. See bench/README.md.
"""

from __future__ import annotations

import argparse
import base64
import itertools
import os
import platform
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import httpx2

TOKENS = {"alice": "alice-soak-token-0123456789abcdef", "bob": "bob-soak-token-0123456789abcdef00"}
REQUEST_TIMEOUT = 60.0  # every HTTP request; a run's own timeout is at most 30 s (the default)
START_BOUND = 60.0
STOP_BOUND = 15.0
COUNTER = "try:\n    n += 1\nexcept NameError:\n    n = 1\nprint(n)"
TS = "const n: number = 6 * 7;\nconsole.log(n);"
UPLOAD = base64.b64encode(b"name,amount\n" + b"".join(b"row%d,%d\n" % (i, i) for i in range(40))).decode()
KINDS = ("warm", "conversation", "typescript", "upload", "timeout", "failure")


@dataclass
class Stats:
    latencies: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    # Outcomes other than the intended one, per kind: the message counted.
    unexpected: dict[str, Counter[str]] = field(default_factory=lambda: defaultdict(Counter))
    measuring: bool = False


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def sample(pid: int) -> tuple[float, int, int]:
    """The server's resident memory (MiB), open descriptors and threads, from /proc."""
    status = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines() if ":" in line)
    rss_kib = int(status["VmRSS"].split()[0])
    return rss_kib / 1024, len(os.listdir(f"/proc/{pid}/fd")), int(status["Threads"])


def disk_usage(path: Path) -> float:
    """MiB under ``path`` (the state directory: database, workspaces, logs)."""
    total = 0
    if not path.is_dir():
        return path.lstat().st_size / (1 << 20)
    for root, _, files in os.walk(path):
        for name in files:
            try:
                total += os.lstat(os.path.join(root, name)).st_size
            except OSError:
                pass
    return total / (1 << 20)


def breakdown(state: Path) -> str:
    """The state directory's MiB per top-level entry (database, logs, workspaces)."""
    return ", ".join(f"{entry.name} {disk_usage(entry):.1f}" for entry in sorted(state.iterdir()))


def print_sample(label: str, pid: int, state: Path, started: float) -> tuple[float, int, int]:
    rss, fds, threads = sample(pid)
    elapsed = time.monotonic() - started
    print(
        f"  {label:<10} t={elapsed:6.1f} s  RSS {rss:7.1f} MiB  fds {fds:4d}  threads {threads:3d}"
        f"  state dir {disk_usage(state):6.1f} MiB",
        flush=True,
    )
    return rss, fds, threads


async def call(http: httpx2.AsyncClient, ids: itertools.count[int], tool: str, arguments: dict[str, Any]) -> Any:
    """One stateless ``tools/call``; the tool's structured result, or a string saying what went wrong."""
    request_id = next(ids)
    body = {
        "jsonrpc": "2.0",
        "id": request_id,
        "method": "tools/call",
        "params": {"name": tool, "arguments": arguments},
    }
    try:
        reply = await http.post("/mcp", json=body)
    except httpx2.HTTPError as error:
        return f"{type(error).__name__}: {error}"
    if reply.status_code != 200:
        return f"HTTP {reply.status_code}: {reply.text[:120]}"
    try:
        message = reply.json()
    except ValueError:
        return f"not JSON: {reply.text[:120]}"
    if "error" in message:
        return f"JSON-RPC {message['error'].get('code')}: {message['error'].get('message', '')[:120]}"
    structured: dict[str, Any] | None = message["result"].get("structuredContent")
    if structured is None:
        return f"no structuredContent: {str(message['result'])[:120]}"
    return structured


def problem(kind: str, outcome: Any, expected_count: int) -> str | None:
    """Why ``outcome`` is not what a run of ``kind`` should give, or None when it is."""
    if isinstance(outcome, str):
        return outcome
    status = outcome.get("status")
    if kind == "upload":
        return None if outcome.get("size") == len(base64.b64decode(UPLOAD)) else f"upload: {str(outcome)[:120]}"
    if kind == "timeout":
        return None if status == "timeout" else f"status {status}: {str(outcome.get('error'))[:120]}"
    if kind == "failure":
        stderr = str(outcome.get("stderr", ""))
        return None if status == "error" and "RuntimeError: soak" in stderr else f"status {status}: {stderr[-120:]}"
    if status != "success":
        detail = outcome.get("error") or str(outcome.get("stderr", ""))[-120:]
        return f"status {status}: {detail}"
    stdout = outcome.get("stdout", "")
    want = {"warm": "499500\n", "typescript": "42\n", "conversation": f"{expected_count}\n"}[kind]
    if stdout == want:
        return None
    if kind == "conversation" and stdout.strip().isdigit():
        return f"variable lost: n = {stdout.strip()} where {expected_count} was due"
    return f"stdout {stdout!r}, expected {want!r}"


async def client(base: str, tenant: str, number: int, stats: Stats, stop_at: list[float]) -> None:
    """Loop over the mix until ``stop_at[0]`` (monotonic), recording latencies once ``stats.measuring``."""
    conversation = f"soak-{tenant}-{number}"
    headers = {"Authorization": f"Bearer {TOKENS[tenant]}", "Accept": "application/json"}
    ids = itertools.count(1)
    counter = 0
    async with httpx2.AsyncClient(base_url=base, headers=headers, timeout=REQUEST_TIMEOUT) as http:
        for round_number in itertools.count():
            kinds = ["warm", "conversation", "typescript", "upload"]
            if round_number % 10 == number % 10:  # now and then, and not all clients at once
                kinds += ["timeout", "failure"]
            for kind in kinds:
                if time.monotonic() >= stop_at[0]:
                    return
                arguments: dict[str, Any]
                tool = "run_python"
                if kind == "warm":
                    arguments = {"code": "print(sum(range(1000)))"}
                elif kind == "conversation":
                    arguments = {"code": COUNTER, "conversationId": conversation}
                elif kind == "typescript":
                    tool, arguments = "run_code", {"code": TS, "language": "typescript"}
                elif kind == "upload":
                    tool = "upload_file"
                    arguments = {"conversationId": conversation, "filename": f"data{round_number % 4}.csv"}
                    arguments["content"] = UPLOAD
                elif kind == "timeout":
                    arguments = {"code": "import time\ntime.sleep(5)", "timeout": 1}
                else:
                    arguments = {"code": "raise RuntimeError('soak')"}
                measuring = stats.measuring
                started = time.perf_counter()
                outcome = await call(http, ids, tool, arguments)
                elapsed = (time.perf_counter() - started) * 1000
                wrong = problem(kind, outcome, counter + 1)
                if kind == "conversation" and isinstance(outcome, dict) and outcome.get("status") == "success":
                    counter = int(outcome["stdout"]) if outcome.get("stdout", "").strip().isdigit() else counter + 1
                if measuring and stats.measuring:
                    stats.latencies[kind].append(elapsed)
                    if wrong is not None:
                        stats.unexpected[kind][wrong] += 1


async def run_clients(
    base: str, pid: int, state: Path, clients: int, seconds: float, warmup: float, every: float
) -> None:
    stats = Stats()
    stop_at = [time.monotonic() + warmup + seconds + 3600]  # set properly once warm-up ends
    tenants = list(TOKENS)
    async with anyio.create_task_group() as group:
        for number in range(clients):
            group.start_soon(client, base, tenants[number % len(tenants)], number, stats, stop_at)
        await anyio.sleep(warmup)
        started = time.monotonic()
        stop_at[0] = started + seconds
        stats.measuring = True
        print(f"\nserver (pid {pid}), after {warmup:.0f} s of warm-up, then every {every:.0f} s")
        first = print_sample("start", pid, state, started)
        start_breakdown = breakdown(state)
        while (left := stop_at[0] - time.monotonic()) > 0:
            await anyio.sleep(min(every, left))
            if stop_at[0] - time.monotonic() > 1:
                print_sample("", pid, state, started)
        stats.measuring = False
        ended = time.monotonic()
        last = print_sample("end", pid, state, started)
        print(f"  state dir by entry (MiB) at the start: {start_breakdown}")
        print(f"  state dir by entry (MiB) at the end:   {breakdown(state)}")
        # The clients stop by themselves; a request still going ends within its timeout.
        group.cancel_scope.deadline = ended + REQUEST_TIMEOUT + 5
    report(stats, ended - started, first, last, clients)


def report(
    stats: Stats,
    duration: float,
    first: tuple[float, int, int],
    last: tuple[float, int, int],
    clients: int,
) -> None:
    total = sum(len(samples) for samples in stats.latencies.values())
    print(f"\n{clients} clients, {len(TOKENS)} tenants, {duration:.0f} s measured")
    print(f"{'kind':<14} {'runs':>7} {'runs/s':>8} {'p50 ms':>9} {'p99 ms':>9} {'unexpected':>11}")
    for kind in KINDS:
        samples = sorted(stats.latencies.get(kind, []))
        if not samples:
            continue
        p50 = samples[len(samples) // 2]
        p99 = samples[min(len(samples) - 1, round(0.99 * (len(samples) - 1)))]
        wrong = sum(stats.unexpected[kind].values())
        print(f"{kind:<14} {len(samples):7d} {len(samples) / duration:8.1f} {p50:9.1f} {p99:9.1f} {wrong:11d}")
    print(f"{'all':<14} {total:7d} {total / duration:8.1f}")
    intended = {kind: len(stats.latencies.get(kind, [])) - sum(stats.unexpected[kind].values()) for kind in KINDS[4:]}
    print(
        f"intended errors: {intended['timeout']} timeouts (timeout 1, sleep 5), {intended['failure']} failures (raise)"
    )
    unexpected = [(kind, text, n) for kind in KINDS for text, n in stats.unexpected[kind].most_common()]
    print(f"unexpected outcomes: {sum(n for _, _, n in unexpected)}")
    for kind, text, n in unexpected[:20]:
        print(f"  {kind:<13} {n:5d}  {text}")
    print("server          start      end")
    print(f"  {'RSS MiB':<10} {first[0]:9.1f} {last[0]:8.1f}")
    print(f"  {'open fds':<10} {first[1]:9d} {last[1]:8d}")
    print(f"  {'threads':<10} {first[2]:9d} {last[2]:8d}")


def config_text() -> str:
    lines = ", ".join(f'{{ tenant = "{tenant}", token = "{token}" }}' for tenant, token in TOKENS.items())
    return textwrap.dedent(f"""\
        discover_servers = false
        [auth]
        tokens = [{lines}]
        """)


def server_env() -> dict[str, str]:
    env = {name: value for name, value in os.environ.items() if not name.startswith("MCP_SANDBOX_")}
    env["MCP_SANDBOX_DISCOVER_SERVERS"] = "false"
    return env


def wait_listening(process: subprocess.Popen[bytes], port: int, log: Path) -> None:
    deadline = time.monotonic() + START_BOUND
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise SystemExit(f"the server exited ({process.returncode}):\n{log.read_text()[-4000:]}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return
        except OSError:
            time.sleep(0.1)
    raise SystemExit(f"the server did not listen within {START_BOUND} s:\n{log.read_text()[-4000:]}")


def stop(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM, a bounded wait, then SIGKILL to its whole process group."""
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(STOP_BOUND)
        except subprocess.TimeoutExpired:
            print(f"the server was still there {STOP_BOUND} s after SIGTERM: SIGKILL", file=sys.stderr)
    try:
        os.killpg(process.pid, signal.SIGKILL)  # its sandboxes too, if any outlived it
    except ProcessLookupError:
        pass
    process.wait(STOP_BOUND)


def main(args: argparse.Namespace) -> None:
    from importlib.metadata import version

    print(f"{platform.platform()}, {os.cpu_count()} CPUs, Python {platform.python_version()}")
    print(f"mcp-sandbox {version('mcp-sandbox')}, httpx2 {version('httpx2')}")
    print(f"load average before: {' '.join(f'{load:.2f}' for load in os.getloadavg())}")
    scratch = Path(tempfile.mkdtemp(prefix="mcp-sandbox-soak-"))
    try:
        os.chmod(scratch, 0o755)
        state, config, log = scratch / "state", scratch / "server.toml", scratch / "server.log"
        config.write_text(config_text())
        port = free_port()
        command = [sys.executable, "-m", "mcp_sandbox", "serve", "--transport", "http", "--host", "127.0.0.1"]
        command += ["--port", str(port), "--state-dir", str(state), "--config", str(config)]
        with log.open("wb") as output:
            process = subprocess.Popen(
                command,
                stdin=subprocess.DEVNULL,
                stdout=output,
                stderr=output,
                env=server_env(),
                start_new_session=True,
            )
        try:
            wait_listening(process, port, log)
            anyio.run(
                run_clients,
                f"http://127.0.0.1:{port}",
                process.pid,
                state,
                args.clients,
                args.seconds,
                args.warmup,
                args.sample_every,
            )
        finally:
            stop(process)
        print(f"server exit status {process.returncode}")
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    print(f"load average after: {' '.join(f'{load:.2f}' for load in os.getloadavg())}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=300, help="how long to measure (default 300)")
    parser.add_argument("--clients", type=int, default=8, help="concurrent clients, alternately alice and bob")
    parser.add_argument("--warmup", type=float, default=10, help="seconds of load before the first sample")
    parser.add_argument("--sample-every", type=float, default=30, help="seconds between samples of the server")
    main(parser.parse_args())
