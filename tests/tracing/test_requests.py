"""The span of each message the server takes: the MCP SDK's span, made by this server's middleware in its place.

Both middlewares wrap the same messages in one process of their own (the tracer provider is
process-wide), each handler ending as a request can: a result, a tool's error result, a protocol
error, invalid params, an exception; a notification; a call with no trace context. The spans must
match but for what this server leaves out on purpose: an exception's message.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

from mcp.server._otel import OpenTelemetryMiddleware

from mcp_sandbox.server.mcp_server import Opening, mcp_server
from mcp_sandbox.tracing.requests import RequestSpans
from tracing.pipelines import PIPELINES, under

TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"

_BOTH = """
import json
from dataclasses import dataclass
from typing import Any

import anyio
import mcp_types as types
from mcp.server._otel import OpenTelemetryMiddleware
from mcp.shared.exceptions import MCPError
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from pydantic import BaseModel

from mcp_sandbox.tracing.requests import RequestSpans


@dataclass
class Ctx:
    method: str
    params: dict[str, Any] | None
    meta: dict[str, Any] | None
    request_id: int | None = 3
    protocol_version: str = "2026-07-28"


class Strict(BaseModel):
    n: int


def call(name: str, traced: bool = True) -> Ctx:
    meta = {"traceparent": "TRACEPARENT", "tracestate": "k=v"} if traced else None
    return Ctx("tools/call", {"name": name, "arguments": {}}, meta)


async def answer(ctx: Ctx) -> Any:
    name = (ctx.params or {}).get("name")
    inside = trace.get_current_span()
    seen.append(format(inside.get_span_context().span_id, "016x") if inside.is_recording() else None)
    if name == "fails":
        return {"content": [], "isError": True}
    if name == "refused":
        raise MCPError(types.INVALID_PARAMS, "no such conversation")
    if name == "invalid":
        Strict.model_validate({"n": "input-plant-1234"})
    if name == "raises":
        raise RuntimeError("message-plant-5678")
    return types.CallToolResult(content=[])


CASES = [call("runs"), call("fails"), call("refused"), call("invalid"), call("raises"), call("untraced", traced=False),
         Ctx("notifications/cancelled", {"requestId": 1}, None, None)]
exporter = InMemorySpanExporter()
provider = TracerProvider()
provider.add_span_processor(SimpleSpanProcessor(exporter))
off = []
seen = []


async def each(middleware: Any) -> None:
    for ctx in CASES:
        try:
            await middleware(ctx, answer)
        except Exception:
            pass


anyio.run(each, RequestSpans())  # no tracer provider yet: tracing is off
off, seen = seen, []
trace.set_tracer_provider(provider)
made = {}
for middleware in (OpenTelemetryMiddleware(), RequestSpans()):
    exporter.clear()
    anyio.run(each, middleware)
    provider.force_flush()
    made[type(middleware).__name__] = [
        {
            "name": span.name,
            "kind": span.kind.name,
            "trace": format(span.context.trace_id, "032x"),
            "parent": format(span.parent.span_id, "016x") if span.parent else None,
            "attributes": dict(span.attributes),
            "status": [span.status.status_code.name, span.status.description],
            "events": [event.name for event in span.events],
            "scope": span.instrumentation_scope.name,
        }
        for span in exporter.get_finished_spans()
    ]
    made[type(middleware).__name__ + " inside"] = [
        span == format(done.context.span_id, "016x") for span, done in zip(seen, exporter.get_finished_spans())
    ]
    seen = []
print(json.dumps({"off": off, **made}))
""".replace("TRACEPARENT", TRACEPARENT)


@PIPELINES
def test_the_servers_request_span_is_the_sdks_without_an_exceptions_message_and_nothing_when_off(pipeline: str) -> None:
    script = under(textwrap.dedent(_BOTH), pipeline)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    made = json.loads(done.stdout)
    assert made["off"] == [None] * 7  # off: the handler runs under no span
    ours, sdk = made["RequestSpans"], made["OpenTelemetryMiddleware"]
    assert made["RequestSpans inside"] == [True] * 7  # the handler runs under the message's span
    assert [span["name"] for span in ours] == [
        "tools/call runs",
        "tools/call fails",
        "tools/call refused",
        "tools/call invalid",
        "tools/call raises",
        "tools/call untraced",
        "notifications/cancelled",
    ]
    assert {span["scope"] for span in ours} == {"mcp_sandbox"}
    trace_id, client_span = TRACEPARENT.split("-")[1:3]
    assert [span["trace"] == trace_id and span["parent"] == client_span for span in ours] == [True] * 5 + [False] * 2
    assert ours[5]["parent"] is None and ours[6]["parent"] is None  # no trace context: a trace of its own
    for mine, theirs in zip(ours, sdk, strict=True):
        assert (mine["name"], mine["kind"], mine["parent"]) == (theirs["name"], theirs["kind"], theirs["parent"])
        if mine["name"] == "tools/call raises":  # the SDK keeps the message; this server its class only
            assert theirs["status"] == ["ERROR", "message-plant-5678"] and theirs["events"] == ["exception"]
            assert mine["status"] == ["ERROR", None] and mine["events"] == []
            assert mine["attributes"] == theirs["attributes"]
            continue
        assert (mine["attributes"], mine["status"], mine["events"]) == (theirs["attributes"], theirs["status"], [])
    assert ours[1]["attributes"]["error.type"] == "tool_error"
    assert ours[2]["attributes"]["rpc.response.status_code"] == "-32602"
    assert ours[6]["attributes"] == {"mcp.method.name": "notifications/cancelled", "mcp.protocol.version": "2026-07-28"}
    assert "plant" not in json.dumps(ours)


def test_the_server_makes_its_request_spans_in_place_of_the_sdks() -> None:
    layers = [type(layer) for layer in mcp_server(Opening()).middleware]
    assert layers[0] is RequestSpans and OpenTelemetryMiddleware not in layers  # outermost: it sees every failure
