"""What tracing costs a warm run: the same server with tracing off and on, side by side in one run.

Two `mcp-sandbox serve` over stdio, started alike but for ``otel_endpoint``: one with none
(tracing off), one exporting over OTLP/gRPC to a receiver of the benchmark's own on loopback
(tests/tracing/receiver.py, on the collector's official service definitions). Warm ``print(1)``
runs alternate between them (so load drifts hit both alike), each with a client's sampled
``traceparent`` in ``_meta`` (a client that traces sends it whether the server traces or not):
every span of a traced run is made, ended and exported. Every third round both servers also get
a run without one (on the traced server, a trace of its own). Then the price of the off path
itself, in process: ``mcp_sandbox.tracing.span`` with no span recording, per call, and the number
of such look-ups a run makes; and the span middleware of each message the server takes (this
server's, and the MCP SDK's it replaces) with no tracer provider installed. Medians and p95 in
milliseconds. Nothing is asserted; absolute numbers drift +-30% between runs on a shared 2-core
machine.

Run: `.venv/bin/python bench/trace_cost.py [--runs N]`.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import secrets
import statistics
import sys
import tempfile
import time
import timeit
from pathlib import Path
from typing import Any

import anyio
from mcp import Client
from mcp.client.stdio import StdioServerParameters
from mcp.server._otel import OpenTelemetryMiddleware as SdkSpans

from mcp_sandbox import tracing
from mcp_sandbox.tracing.requests import RequestSpans

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from tracing.receiver import grpc_receiver  # noqa: E402 - tests/ is put on the path just above

# What a warm run without code mode or network asks of mcp_sandbox.tracing: its placement's step
# (tracing.step) and the span its run is told on (tracing.current()), one context look-up each when off.
LOOKUPS_PER_RUN = 2


def _pythonpath() -> dict[str, str]:
    return {"PYTHONPATH": os.environ["PYTHONPATH"]} if "PYTHONPATH" in os.environ else {}


def _server(state_dir: Path, env: dict[str, str]) -> StdioServerParameters:
    return StdioServerParameters(
        command=sys.executable,
        args=["-m", "mcp_sandbox", "serve", "--state-dir", str(state_dir)],
        # The stdio client passes no PYTHONPATH of its own: a checkout run without installing needs it.
        env={"MCP_SANDBOX_DISCOVER_SERVERS": "false", **env, **_pythonpath()},
    )


def _serve_pid(state_dir: Path) -> int:
    """The pid of the ``mcp-sandbox serve`` child of this process serving ``state_dir``."""
    for task in Path(f"/proc/{os.getpid()}/task").iterdir():
        for child in (task / "children").read_text().split():
            with contextlib.suppress(OSError):
                if str(state_dir).encode() in Path(f"/proc/{child}/cmdline").read_bytes().split(b"\0"):
                    return int(child)
    raise RuntimeError(f"no server of {state_dir} among this process's children")


def _cpu_ms(pid: int, thread: int | None = None) -> float:
    """CPU time (user + system) of process ``pid`` so far, in ms: every thread (the exporter's too), or
    only ``thread``'s."""
    stat = Path(f"/proc/{pid}/stat" if thread is None else f"/proc/{pid}/task/{thread}/stat")
    fields = stat.read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) * 1000 / os.sysconf("SC_CLK_TCK")


async def _run(client: Client, traced: bool) -> float:
    meta: Any = {"traceparent": f"00-{secrets.token_hex(16)}-{secrets.token_hex(8)}-01"} if traced else None
    started = time.perf_counter()
    result = await client.call_tool("run_python", {"code": "print(1)"}, meta=meta)
    elapsed = (time.perf_counter() - started) * 1000
    if (result.structured_content or {}).get("status") != "success":
        raise RuntimeError(f"run failed: {result.structured_content}")
    return elapsed


class _Call:
    """The parts of a request's context a span middleware reads: a traced ``tools/call``."""

    def __init__(self) -> None:
        self.method = "tools/call"
        self.protocol_version = "2026-07-28"
        self.request_id = 1
        self.meta = {"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}
        self.params = {"name": "run_python", "arguments": {"code": "print(1)"}, "_meta": self.meta}


async def _answer(ctx: Any) -> dict[str, Any]:
    return {"content": []}


def _drive(middleware: Any) -> None:
    """One message through ``middleware``, its handler answering at once (no event loop: nothing waits)."""
    with contextlib.suppress(StopIteration):
        middleware(_Call(), _answer).send(None)


def _line(label: str, samples: list[float]) -> float:
    ordered = sorted(samples)
    median, p95 = statistics.median(ordered), ordered[round(0.95 * (len(ordered) - 1))]
    print(f"  {label:<48} {median:8.3f} {p95:8.3f}  n={len(samples)}")
    return median


async def main(runs: int) -> None:
    with tempfile.TemporaryDirectory(prefix="mcp-sandbox-bench-") as scratch, grpc_receiver() as (endpoint, received):
        root = Path(scratch)
        os.chmod(root, 0o755)  # the sandbox's uid reaches the state directories under it
        traced_env = {"MCP_SANDBOX_OTEL_ENDPOINT": endpoint}  # the SDK's default batching: every 5 s
        async with contextlib.AsyncExitStack() as stack:
            off = await stack.enter_async_context(Client(_server(root / "off", {})))
            on = await stack.enter_async_context(Client(_server(root / "on", traced_env)))
            for _ in range(30):  # the warm pools start, the code paths warm up
                await _run(off, True)
                await _run(on, True)
            times: dict[str, list[float]] = {"off": [], "on": [], "off, no traceparent": [], "on, no traceparent": []}
            pids = {"off": _serve_pid(root / "off"), "on": _serve_pid(root / "on")}
            cpu = {name: _cpu_ms(pid) for name, pid in pids.items()}
            loop = {name: _cpu_ms(pid, pid) for name, pid in pids.items()}  # the main thread runs the event loop
            for index in range(runs):
                times["off"].append(await _run(off, True))
                times["on"].append(await _run(on, True))
                if index % 3 == 0:  # still alternating: neither server runs twice in a row (its warm pool refills)
                    times["off, no traceparent"].append(await _run(off, False))
                    times["on, no traceparent"].append(await _run(on, False))
            per_server = runs + len(times["on, no traceparent"])
            cpu = {name: (_cpu_ms(pid) - cpu[name]) / per_server for name, pid in pids.items()}
            loop = {name: (_cpu_ms(pid, pid) - loop[name]) / per_server for name, pid in pids.items()}
        print(f"\n{'warm print(1) over stdio (ms)':<50} {'median':>8} {'p95':>8}")
        medians = {label: _line(f"tracing {label}", samples) for label, samples in times.items()}
        print(f"  {'added by tracing (on - off, medians)':<48} {medians['on'] - medians['off']:8.3f}")
        untraced = medians["on, no traceparent"] - medians["off, no traceparent"]
        print(f"  {'  the same, no traceparent':<48} {untraced:8.3f}")
        traced_runs = 30 + per_server
        print(f"  spans exported: {len(received.spans())} ({len(received.spans()) / traced_runs:.1f} per traced run)")
        print("the server process's CPU per warm run (ms; all its threads)")
        print(f"  {'tracing off':<48} {cpu['off']:8.3f}")
        print(f"  {'tracing on':<48} {cpu['on']:8.3f}")
        print(f"  {'added by tracing':<48} {cpu['on'] - cpu['off']:8.3f}")
        print(f"  {'  of it in the event loop thread':<48} {loop['on'] - loop['off']:8.3f}")

    def off_path() -> None:
        with tracing.span("bench", {"a": 1}):
            pass

    loops = 200_000
    per_call = min(timeit.repeat(off_path, number=loops, repeat=5)) / loops * 1e6
    print("\ntracing off, in process")
    print(f"  {'mcp_sandbox.tracing.span(), no span recording':<48} {per_call:8.3f} us per call")
    print(f"  {'per warm run (' + str(LOOKUPS_PER_RUN) + ' calls)':<48} {per_call * LOOKUPS_PER_RUN:8.3f} us")
    for label, middleware in (("RequestSpans", RequestSpans()), ("the MCP SDK's OpenTelemetryMiddleware", SdkSpans())):
        drive = functools.partial(_drive, middleware)
        per_message = min(timeit.repeat(drive, number=loops // 10, repeat=5)) / loops * 10 * 1e6
        print(f"  {label + ', per message':<48} {per_message:8.3f} us")
    added = {
        "wall_ms": round(medians["on"] - medians["off"], 3),
        "cpu_ms": round(cpu["on"] - cpu["off"], 3),
        "loop_cpu_ms": round(loop["on"] - loop["off"], 3),
    }
    print(json.dumps({"added": added, "off_path_us": round(per_call, 3)}))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=300, help="warm runs on each server (default 300)")
    anyio.run(main, parser.parse_args().runs)
