"""mcp_sandbox.tracing's rules: nothing made when off, no exception text when on; a step told on its call's span
unless in the background; where traces go; the HTTP header; an admission span only for a run that waits."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest
from opentelemetry import baggage, trace
from starlette.datastructures import Headers

from mcp_sandbox import tracing
from mcp_sandbox.errors import ConfigError
from mcp_sandbox.server.transport.mcp_route import _continue_trace
from mcp_sandbox.tracing.export import traces_url
from tracing.pipelines import PIPELINES, under

TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


def test_off_a_span_is_one_shared_empty_block_and_no_trace_id() -> None:
    first, second = tracing.span("a", {"k": 1}), tracing.span("b")
    with first as opened:
        assert opened is None
    assert first is second
    assert tracing.trace_id() is None and not tracing.enabled()
    carrier: dict[str, str] = {}
    tracing.inject(carrier)
    assert carrier == {}
    assert tracing.context_of({"traceparent": TRACEPARENT}) is None  # off: a header starts nothing


# In a process of its own: the tracer provider is process-wide, and this worker's other tests trace nothing.
_ON = """
import asyncio
import json
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

exporter = InMemorySpanExporter()
provider = TracerProvider()
provider.add_span_processor(SimpleSpanProcessor(exporter))
trace.set_tracer_provider(provider)
from mcp_sandbox import tracing

with tracing.span("untraced") as none:
    pass
parent = tracing.context_of({"traceparent": "TRACEPARENT"})
with tracing.span("root", context=parent) as root:
    during = tracing.trace_id()
    try:
        with tracing.span("child", {"mcp_sandbox.language": "python"}):
            raise ValueError("secret-in-a-message-31337")
    except ValueError:
        pass
    try:
        with tracing.span("cancelled"):
            raise asyncio.CancelledError
    except asyncio.CancelledError:
        pass
    with tracing.step("folded") as told:  # within the call: told on its span
        told_root = told is root
        told.set_attribute("mcp_sandbox.placement", "warm")
    with tracing.background(), tracing.step("stepped") as own:  # may outlive it: a span of its own
        own.set_attribute("mcp_sandbox.placement", "session")
with tracing.span("fails", context=parent) as fails:
    try:
        with tracing.step("folded-fails"):
            raise KeyError("secret-in-a-message-31337")
    except KeyError:
        pass
    fails_recording = fails.is_recording()
with tracing.step("untraced-step") as untraced_step:
    pass
provider.force_flush()
spans = {span.name: span for span in exporter.get_finished_spans()}
child = spans["child"]
print(json.dumps({
    "none": none is None,
    "names": sorted(spans),
    "during": during,
    "parent": format(spans["root"].parent.span_id, "016x"),
    "child_parent": child.parent.span_id == spans["root"].context.span_id,
    "attributes": dict(child.attributes),
    "status": [child.status.status_code.name, child.status.description],
    "events": len(child.events),
    "cancelled": [dict(spans["cancelled"].attributes), spans["cancelled"].status.status_code.name],
    "told": [told_root, dict(spans["root"].attributes)],
    "stepped": [spans["stepped"].parent.span_id == spans["root"].context.span_id, dict(spans["stepped"].attributes)],
    "fails": [fails_recording, dict(spans["fails"].attributes), spans["fails"].status.status_code.name],
    "untraced_step": untraced_step is None,
}))
""".replace("TRACEPARENT", TRACEPARENT)


@PIPELINES
def test_on_a_span_continues_a_traceparent_keeps_an_exceptions_class_not_its_message_and_steps_fold_into_it(
    pipeline: str,
) -> None:
    script = under(textwrap.dedent(_ON), pipeline)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout)
    assert seen["none"] and seen["names"] == ["cancelled", "child", "fails", "root", "stepped"]  # none untraced
    assert seen["during"] == TRACEPARENT.split("-")[1] and seen["parent"] == TRACEPARENT.split("-")[2]
    assert seen["child_parent"]
    assert seen["attributes"] == {"mcp_sandbox.language": "python", "error.type": "ValueError"}
    assert seen["status"] == ["ERROR", None] and seen["events"] == 0
    assert seen["cancelled"] == [{}, "UNSET"]  # a cancellation (a run's end closing a connection) is no error
    # A step within the call is told on the call's span; in work that may outlive it, on a child of its own.
    assert seen["told"] == [True, {"mcp_sandbox.placement": "warm"}]
    assert seen["stepped"] == [True, {"mcp_sandbox.placement": "session"}]
    assert seen["fails"] == [True, {"error.type": "KeyError"}, "ERROR"]  # marked, not ended
    assert seen["untraced_step"]
    assert "secret-in-a-message" not in done.stdout + done.stderr


_ADMISSION = """
import json
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
from mcp_sandbox.engine.admission import Admission
from mcp_sandbox.errors import BusyError


async def main() -> None:
    admission = Admission(1, 4, 0.05)
    release = anyio.Event()

    async def hold(tenant: str) -> None:
        with tracing.span(f"call {tenant}", context=tracing.context_of({"traceparent": "TRACEPARENT"})):
            try:
                async with admission.slot(tenant):
                    await release.wait()
            except BusyError:
                pass

    async with anyio.create_task_group() as group:
        group.start_soon(hold, "free")
        await anyio.wait_all_tasks_blocked()
        await hold("refused")  # waits out the 0.05 s bound
        group.start_soon(hold, "waited")
        await anyio.wait_all_tasks_blocked()
        release.set()


anyio.run(main)
provider.force_flush()
spans = exporter.get_finished_spans()
calls = {span.context.span_id: span.name for span in spans if span.name.startswith("call ")}
print(json.dumps(sorted(
    [calls[span.parent.span_id], dict(span.attributes), span.status.status_code.name]
    for span in spans if span.name == "mcp_sandbox.admission"
)))
""".replace("TRACEPARENT", TRACEPARENT)


@PIPELINES
def test_only_a_run_that_waits_for_its_slot_has_an_admission_span(pipeline: str) -> None:
    script = under(textwrap.dedent(_ADMISSION), pipeline)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == [
        ["call refused", {"mcp_sandbox.tenant": "refused", "error.type": "BusyError"}, "ERROR"],
        ["call waited", {"mcp_sandbox.tenant": "waited"}, "UNSET"],
    ]


@pytest.mark.parametrize(
    ("endpoint", "protocol", "url"),
    [
        ("http://127.0.0.1:4317", "grpc", "http://127.0.0.1:4317"),
        ("http://collector:4318", "http/protobuf", "http://collector:4318/v1/traces"),
        ("https://collector/otlp/", "http/protobuf", "https://collector/otlp/v1/traces"),
        ("http://collector:4318/v1/traces", "http/protobuf", "http://collector:4318/v1/traces"),
    ],
)
def test_the_endpoint_is_the_otlp_base_url(endpoint: str, protocol: str, url: str) -> None:
    assert traces_url(endpoint, protocol) == url


@pytest.mark.parametrize(("endpoint", "protocol"), [("collector:4317", "grpc"), ("http://c:4317", "http/json")])
def test_a_wrong_endpoint_or_protocol_is_refused(endpoint: str, protocol: str) -> None:
    with pytest.raises(ConfigError):
        traces_url(endpoint, protocol)


def test_an_http_traceparent_header_goes_into_meta_unless_meta_names_a_trace() -> None:
    headers = Headers({"traceparent": TRACEPARENT, "tracestate": "k=v", "authorization": "Bearer t"})
    call = {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "run_python"}}
    assert _continue_trace(call, headers)
    assert call["params"] == {"name": "run_python", "_meta": {"traceparent": TRACEPARENT, "tracestate": "k=v"}}
    own = {"jsonrpc": "2.0", "id": 2, "method": "tools/list", "params": {"_meta": {"traceparent": "00-own"}}}
    assert not _continue_trace(own, headers) and own["params"] == {"_meta": {"traceparent": "00-own"}}
    assert not _continue_trace({"jsonrpc": "2.0", "method": "notifications/initialized"}, headers)
    assert not _continue_trace([call], headers)


def test_off_the_server_loads_no_opentelemetry_sdk_or_exporter() -> None:
    script = (
        "import sys, mcp_sandbox.cli, mcp_sandbox.server.app, mcp_sandbox.engine;"
        "print([m for m in sys.modules if m.startswith(('opentelemetry.sdk', 'opentelemetry.exporter', 'grpc'))])"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_a_remote_parent_is_w3c_trace_context_and_a_value_of_the_wrong_type_names_none() -> None:
    parent = tracing.remote_parent({"traceparent": TRACEPARENT, "tracestate": "k=v", "baggage": "user=7"})
    assert parent is not None
    named = trace.get_current_span(parent).get_span_context()
    assert (format(named.trace_id, "032x"), format(named.span_id, "016x")) == tuple(TRACEPARENT.split("-")[1:3])
    assert named.is_remote and named.trace_state.get("k") == "v" and baggage.get_all(parent) == {"user": "7"}
    zero_span = TRACEPARENT.replace("b7ad6b7169203331", "0" * 16)
    for carrier in ({}, {"traceparent": zero_span}, {"traceparent": 5}, {"traceparent": TRACEPARENT, "baggage": 3}):
        assert tracing.remote_parent(carrier) is None, carrier
