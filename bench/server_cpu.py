"""The server's CPU per call for two source trees side by side: a change against what it replaces.

Two real servers, each run from its own ``src/`` (``--baseline`` and ``--change``), over stdio
(tenant ``default``) or, with ``--http``, over Streamable HTTP for a token tenant; warm
``print(1)`` calls (or ``--tool list_runners``) back to back, ``--calls`` per round, the two
servers taking turns (in turn first) for ``--rounds``, so that a shared machine's load falls on
both. It prints, per tree, the median over the rounds of the server process's CPU per call (user
+ system, all its threads, from ``/proc`` in clock ticks of 10 ms: give it at least 100 calls),
the same for its sandboxes (every process under the server with the children each reaped: a
warm run's child counts once its zygote has reaped it) and their page faults per call (which
the load does not move), and the median round trip. The CPU moves far less with the machine's
load than the times do.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
from deployed import server_cpu
from first_run import TOKENS, http_client, http_server, server
from mcp import Client

ROOT = Path(__file__).resolve().parent.parent


def server_pid(state_dir: Path) -> int:
    """The pid of the ``serve`` process whose state directory is ``state_dir``."""
    wanted = ["--state-dir", str(state_dir)]
    for entry in Path("/proc").iterdir():
        with contextlib.suppress(OSError):
            args = (entry / "cmdline").read_bytes().decode(errors="replace").split("\0")
            if any(args[i : i + 2] == wanted for i in range(len(args) - 1)):
                return int(entry.name)
    raise RuntimeError(f"no server with the state directory {state_dir}")


def sandboxes_cpu(server: int) -> tuple[float, int]:
    """The CPU time (ms) and the page faults so far of the server's sandboxes: every process under
    it (bwrap, the gates, the zygotes) with its reaped children (a zygote's runs), and those the
    server itself reaped."""
    children: dict[int, list[int]] = {}
    counts: dict[int, tuple[int, int]] = {}  # (ticks, faults), reaped children's included
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
                children.setdefault(int(fields[1]), []).append(int(entry.name))
                ticks = sum(int(field) for field in fields[11:15])
                counts[int(entry.name)] = (ticks, int(fields[7]) + int(fields[8]))
    fields = (Path(f"/proc/{server}") / "stat").read_text().rsplit(")", 1)[1].split()
    ticks, faults = int(fields[13]) + int(fields[14]), int(fields[8])
    todo = list(children.get(server, []))
    while todo:
        pid = todo.pop()
        ticks, faults = ticks + counts.get(pid, (0, 0))[0], faults + counts.get(pid, (0, 0))[1]
        todo.extend(children.get(pid, []))
    return ticks * 1000 / os.sysconf("SC_CLK_TCK"), faults


@contextlib.contextmanager
def sources(src: str) -> Iterator[None]:
    """``PYTHONPATH`` set to ``src`` while the block starts a server (an HTTP server takes the environment)."""
    before = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = src
    try:
        yield
    finally:
        if before is None:
            del os.environ["PYTHONPATH"]
        else:
            os.environ["PYTHONPATH"] = before


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", required=True, help="the src/ directory of the tree to compare with")
    parser.add_argument("--change", default=str(ROOT / "src"), help="the src/ directory of the change (this tree's)")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--calls", type=int, default=150, help="calls per server and round")
    parser.add_argument("--http", action="store_true", help="Streamable HTTP for a token tenant (as root)")
    parser.add_argument("--tool", default="run_python", choices=["run_python", "list_runners"])
    parser.add_argument("--code", default="print(1)", help="what each run_python call runs")
    options = parser.parse_args()
    arguments: dict[str, Any] = {"code": options.code} if options.tool == "run_python" else {}
    trees = {"baseline": options.baseline, "change": options.change}
    with tempfile.TemporaryDirectory(prefix="mcp-sandbox-bench-") as scratch:
        os.chmod(scratch, 0o755)
        async with contextlib.AsyncExitStack() as stack:
            clients: dict[str, tuple[Client, Path]] = {}
            for label, src in trees.items():
                state_dir = Path(scratch) / label
                if options.http:
                    with sources(src):
                        base = stack.enter_context(http_server(state_dir))
                    client = await stack.enter_async_context(http_client(base, TOKENS["token tenant"]))
                else:
                    parameters = server(state_dir, "2")
                    assert parameters.env is not None
                    parameters.env["PYTHONPATH"] = src
                    client = await stack.enter_async_context(Client(parameters))
                clients[label] = (client, state_dir)
            for client, _ in clients.values():  # the pools filled, the servers warmed up
                for _ in range(200):
                    await client.call_tool(options.tool, arguments)
            pids = {label: server_pid(state_dir) for label, (_, state_dir) in clients.items()}
            cpu: dict[str, list[float]] = {label: [] for label in trees}
            sandboxes: dict[str, list[float]] = {label: [] for label in trees}
            faults: dict[str, list[float]] = {label: [] for label in trees}
            wall: dict[str, list[float]] = {label: [] for label in trees}
            load = os.getloadavg()[0]
            for round_ in range(options.rounds):
                order = list(clients.items()) if round_ % 2 == 0 else list(reversed(clients.items()))
                for label, (client, state_dir) in order:
                    spent, samples = server_cpu(state_dir), []
                    inside, faulted = sandboxes_cpu(pids[label])
                    for _ in range(options.calls):
                        started = time.perf_counter()
                        await client.call_tool(options.tool, arguments)
                        samples.append((time.perf_counter() - started) * 1000)
                    cpu[label].append((server_cpu(state_dir) - spent) / options.calls)
                    inside_after, faulted_after = sandboxes_cpu(pids[label])
                    sandboxes[label].append((inside_after - inside) / options.calls)
                    faults[label].append((faulted_after - faulted) / options.calls)
                    wall[label].append(statistics.median(samples))
    transport = "Streamable HTTP, token tenant" if options.http else "stdio, default"
    print(f"{options.tool} over {transport}, {options.rounds} rounds of {options.calls} calls per tree")
    print(f"load average {load:.1f} at the start, {os.getloadavg()[0]:.1f} at the end")
    for label, src in trees.items():
        rounds = " ".join(f"{value:.2f}" for value in cpu[label])
        print(f"  {label} ({src}): server CPU per call {statistics.median(cpu[label]):.2f} ms (rounds: {rounds})")
        rounds = " ".join(f"{value:.2f}" for value in sandboxes[label])
        print(f"    the sandboxes' CPU per call {statistics.median(sandboxes[label]):.2f} ms (rounds: {rounds})")
        print(f"    the sandboxes' page faults per call {statistics.median(faults[label]):.0f}")
        print(f"    round trip, median of the rounds' medians {statistics.median(wall[label]):.2f} ms")


if __name__ == "__main__":
    sys.exit(anyio.run(main))
