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
server's, and the MCP SDK's it replaces) with no tracer provider installed; then, with one, each
part of a traced run's span (extracting the ``traceparent``, starting, telling the run, ending),
as the OpenTelemetry SDK's span and as this server's own (``mcp_sandbox.tracing.spans``, with the
SDK's span it is made into off the loop), and what the exporter's thread spends on a span (OTLP
encoding, a gRPC export to the receiver), in CPU time of the calling thread. Medians and p95 in
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
from typing import Any, cast

import anyio
from mcp import Client
from mcp.client.stdio import StdioServerParameters
from mcp.server._otel import OpenTelemetryMiddleware as SdkSpans
from opentelemetry import context as otel_context
from opentelemetry.trace import SpanKind

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
    _parts_on()
    added = {
        "wall_ms": round(medians["on"] - medians["off"], 3),
        "cpu_ms": round(cpu["on"] - cpu["off"], 3),
        "loop_cpu_ms": round(loop["on"] - loop["off"], 3),
    }
    print(json.dumps({"added": added, "off_path_us": round(per_call, 3)}))


def _per_call_us(call: Any, number: int) -> float:
    """``call``'s CPU time in this thread, in us: the best of five rounds of ``number`` calls."""
    return min(timeit.repeat(call, number=number, repeat=5, timer=time.thread_time)) / number * 1e6


def _valid(context: Any) -> bool:
    """What ``tracing.remote_parent`` checks of what it extracted (to compare like with like)."""
    from opentelemetry import trace

    return bool(trace.get_current_span(context).get_span_context().is_valid)


def _parts_on() -> None:
    """Each part of a traced warm run's span, in process (CPU time of this thread, best of five rounds): what the
    event loop does for it, and what the exporter's thread does for it, against an OTLP/gRPC receiver on loopback.
    A tight loop keeps all of it in the CPU's caches: in the running server each part costs several times more."""
    from opentelemetry import propagate, trace
    from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.trace import Span as SdkSpan
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    from mcp_sandbox.tracing.records import OffLoop
    from mcp_sandbox.tracing.spans import OwnSpan, pipeline_of

    with grpc_receiver() as (endpoint, _):
        exporter = OTLPSpanExporter(endpoint=endpoint, insecure=True)
        # Nothing exported while timing (the queue holds every span ended), so no other thread runs meanwhile.
        provider = TracerProvider(shutdown_on_exit=False)  # the SDK's spans, as before this server made its own
        provider.add_span_processor(BatchSpanProcessor(exporter, 1 << 20, 3_600_000, 1 << 19))
        tracer = provider.get_tracer(tracing.SCOPE)
        # This server's own spans, as the server makes them (what RequestSpans uses once installed).
        ours = TracerProvider(shutdown_on_exit=False, active_span_processor=OffLoop(tracing.SCOPE))
        ours.add_span_processor(BatchSpanProcessor(exporter, 1 << 20, 3_600_000, 1 << 19))
        trace.set_tracer_provider(ours)
        pipeline = pipeline_of(ours.get_tracer(tracing.SCOPE))
        assert pipeline is not None
        call = _Call()
        parent = tracing.remote_parent(call.meta)
        name, kind = "tools/call run_python", SpanKind.SERVER
        started = {  # what RequestSpans starts it with
            "mcp.method.name": "tools/call",
            "mcp.protocol.version": call.protocol_version,
            "jsonrpc.request.id": "1",
            "gen_ai.operation.name": "execute_tool",
            "gen_ai.tool.name": "run_python",
        }
        placed: dict[str, tracing.AttributeValue] = {
            "mcp_sandbox.language": "python",
            "mcp_sandbox.network": False,
            "mcp_sandbox.placement": "warm",
        }
        ended: dict[str, tracing.AttributeValue] = {
            "mcp_sandbox.run.status": "success",
            "mcp_sandbox.run.done": True,
            "mcp_sandbox.run.exit_code": 0,
        }
        number = 2_000
        name, kind = "tools/call run_python", SpanKind.SERVER
        spans = [tracer.start_span(name, parent, kind, started) for _ in range(5 * number)]
        own = [pipeline.start(name, parent, kind, started) for _ in range(5 * number)]
        pending = iter(spans)

        def tell() -> None:
            opened = next(pending)
            opened.add_event("mcp_sandbox.run.start")
            opened.set_attributes(placed)
            opened.set_attributes(ended)

        def tell_own() -> None:
            opened = next(told)
            opened.add_event("mcp_sandbox.run.start")
            opened.set_attributes(placed)
            opened.set_attributes(ended)

        def attach() -> None:
            otel_context.detach(otel_context.attach(trace.set_span_in_context(spans[0])))

        parts = {
            "extract _meta: the configured propagators": lambda: _valid(propagate.extract(call.meta)),
            "extract _meta: W3C (tracing.remote_parent)": lambda: tracing.remote_parent(call.meta),
            "start_span, 5 attributes": lambda: tracer.start_span(name, parent, kind, started),
            "attach and detach it": attach,
            "tell the run: an event, 6 attributes": tell,
        }
        told = iter(own)
        print("\ntracing on, in process (us of this thread's CPU)")
        for label, part in parts.items():
            print(f"  {label:<48} {_per_call_us(part, number):8.3f}")
        pending = iter(spans)
        print(f"  {'end it (into the batch queue)':<48} {_per_call_us(lambda: next(pending).end(), number):8.3f}")
        print("  this server's own span (tracing.spans), on the event loop")
        own_parts = {
            "  start, 5 attributes (the sampler, ids)": lambda: pipeline.start(name, parent, kind, started),
            "  tell the run: an event, 6 attributes": tell_own,
        }
        for label, part in own_parts.items():
            print(f"  {label:<48} {_per_call_us(part, number):8.3f}")
        ending = iter(own)
        print(f"  {'  end it (handed to the queue)':<48} {_per_call_us(lambda: next(ending).end(), number):8.3f}")
        drive = functools.partial(_drive, RequestSpans())
        print(f"  {'RequestSpans, per traced message (all of it)':<48} {_per_call_us(drive, number // 4):8.3f}")
        ended_own = [opened for opened in own if isinstance(opened, OwnSpan) and not opened.is_recording()]
        offloop = cast(OffLoop, pipeline.sink)
        converting = iter(ended_own)
        made = _per_call_us(lambda: offloop._readable(next(converting)), number)
        print(f"  {'  made the SDK span, off the loop (its thread)':<48} {made:8.3f}")
        # An ended SDK span is the ReadableSpan its processors get.
        readable = [opened for opened in spans if isinstance(opened, SdkSpan) and not opened.is_recording()][:512]
        print("  the exporter's thread, per span of a batch of 512")
        encoding, sending = (
            _per_call_us(lambda: encode_spans(readable), 3),
            _per_call_us(lambda: exporter.export(readable), 3),
        )
        print(f"  {'  encode for OTLP':<48} {encoding / 512:8.3f}")
        print(f"  {'  export over gRPC (encode included)':<48} {sending / 512:8.3f}")
        print(f"  {'  export of one span alone':<48} {_per_call_us(lambda: exporter.export(readable[:1]), 20):8.3f}")
        # No shutdown: it would export the thousands of spans queued; the exporter's thread dies with the process.


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=300, help="warm runs on each server (default 300)")
    anyio.run(main, parser.parse_args().runs)
