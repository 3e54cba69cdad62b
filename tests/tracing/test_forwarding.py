"""A call forwarded to the replica that owns its conversation continues the sender's trace on the owner.

Both ends are real (the forwarding client against the owner's internal route on uvicorn, as in
tests/replicas/test_forward_route.py), in a process of their own: the tracer provider is process-wide.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

from tracing.pipelines import PIPELINES, under

TESTS = Path(__file__).resolve().parents[1]
TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"

_SCRIPT = """
import json, sys
import anyio
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

exporter = InMemorySpanExporter()
provider = TracerProvider()
provider.add_span_processor(SimpleSpanProcessor(exporter))
trace.set_tracer_provider(provider)

from mcp_sandbox import tracing
from mcp_sandbox.replicas.forward import Forwarder
from replicas.test_forward_route import BOUND, KEY, owner


async def main() -> None:
    calls = []
    async with owner(calls) as url:
        forwarder = Forwarder("http://127.0.0.1:1", KEY, BOUND)
        try:
            with tracing.span("tools/call run_python", context=tracing.context_of({"traceparent": "TRACEPARENT"})):
                with anyio.fail_after(BOUND):
                    await forwarder.forward(url, "run_python", {"code": "print(1)"}, "default")
        finally:
            await forwarder.aclose()


anyio.run(main)
provider.force_flush()
spans = {span.name: span for span in exporter.get_finished_spans()}
print(json.dumps({
    name: {
        "trace": format(span.context.trace_id, "032x"),
        "span": format(span.context.span_id, "016x"),
        "parent": format(span.parent.span_id, "016x") if span.parent else None,
        "remote": bool(span.parent and span.parent.is_remote),
        "attributes": dict(span.attributes),
    }
    for name, span in spans.items()
}))
""".replace("TRACEPARENT", TRACEPARENT)


@PIPELINES
def test_the_owner_continues_the_forwarding_replicas_trace_from_its_header(pipeline: str) -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(TESTS), os.environ.get("PYTHONPATH")]))}
    script = under(textwrap.dedent(_SCRIPT), pipeline)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, env=env)
    assert done.returncode == 0, done.stderr
    spans = json.loads(done.stdout)
    sent, served = spans["mcp_sandbox.forward"], spans["mcp_sandbox.forwarded"]
    trace_id = TRACEPARENT.split("-")[1]
    assert {span["trace"] for span in spans.values()} == {trace_id}
    assert sent["parent"] == spans["tools/call run_python"]["span"]
    assert served["parent"] == sent["span"] and served["remote"]  # continued from the HTTP header
    assert sent["attributes"] == {"gen_ai.tool.name": "run_python", "http.response.status_code": 200}
    assert served["attributes"] == {"gen_ai.tool.name": "run_python"}
