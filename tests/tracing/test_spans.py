"""This server's own spans (tracing.spans) and their export side (tracing.records), in process.

Each test builds an SDK tracer provider with :class:`OffLoop` as its span processor and starts
spans through its pipeline directly: nothing is installed process-wide. What is exported is the
SDK's ``ReadableSpan``, read back from the SDK's in-memory exporter.
"""

from __future__ import annotations

import pytest
from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.id_generator import IdGenerator
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF
from opentelemetry.trace import SpanKind, StatusCode

from mcp_sandbox import tracing
from mcp_sandbox.tracing.records import OffLoop
from mcp_sandbox.tracing.spans import OwnSpan, Pipeline, pipeline_of

TRACE_ID, CLIENT_SPAN = "0af7651916cd43dd8448eb211c80319c", "b7ad6b7169203331"


class _Counting(IdGenerator):
    """Ids the test can tell apart from random ones."""

    def __init__(self) -> None:
        self.next = 0

    def generate_span_id(self) -> int:
        self.next += 1
        return self.next

    def generate_trace_id(self) -> int:
        return 0xABC


def _pipeline(provider: TracerProvider) -> Pipeline:
    pipeline = pipeline_of(provider.get_tracer(tracing.SCOPE))
    assert pipeline is not None
    return pipeline


def _provider(exporter: InMemorySpanExporter, **options: object) -> TracerProvider:
    provider = TracerProvider(active_span_processor=OffLoop(tracing.SCOPE), **options)  # type: ignore[arg-type]
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider


def _parent(flags: str) -> Context:
    parent = tracing.remote_parent({"traceparent": f"00-{TRACE_ID}-{CLIENT_SPAN}-{flags}", "tracestate": "k=v"})
    assert parent is not None
    return parent


def test_an_own_span_is_exported_as_the_sdks_span_with_the_providers_resource_ids_and_scope() -> None:
    exporter, ids = InMemorySpanExporter(), _Counting()
    provider = _provider(exporter, resource=Resource({"service.name": "own-test"}), id_generator=ids)
    pipeline = _pipeline(provider)
    opened = pipeline.start("tools/call run_python", _parent("01"), SpanKind.SERVER, {"mcp.method.name": "tools/call"})
    assert isinstance(opened, OwnSpan) and opened.is_recording()
    with tracing.span("child", context=trace.set_span_in_context(opened)) as child:
        assert child is not None
    opened.set_attributes({"mcp_sandbox.placement": "warm", "mcp_sandbox.run.exit_code": 0})
    opened.add_event("mcp_sandbox.run.start")
    opened.update_name("tools/call run_code")
    opened.set_status(StatusCode.ERROR, "no such conversation")
    opened.set_status(StatusCode.UNSET)  # ignored, as by the SDK's span
    opened.end()
    opened.set_attribute("after", "end")  # ignored: it has ended
    assert not opened.is_recording() and provider.force_flush(5_000)
    [exported] = exporter.get_finished_spans()
    assert exported.name == "tools/call run_code" and exported.kind is SpanKind.SERVER
    assert exported.instrumentation_scope is not None and exported.instrumentation_scope.name == "mcp_sandbox"
    assert exported.resource.attributes["service.name"] == "own-test"
    assert exported.context is not None and exported.parent is not None
    assert (format(exported.context.trace_id, "032x"), exported.context.span_id) == (TRACE_ID, 1)
    assert format(exported.parent.span_id, "016x") == CLIENT_SPAN and exported.parent.is_remote
    assert exported.context.trace_flags.sampled and exported.context.trace_state.get("k") == "v"
    assert dict(exported.attributes or {}) == {
        "mcp.method.name": "tools/call",
        "mcp_sandbox.placement": "warm",
        "mcp_sandbox.run.exit_code": 0,
    }
    assert [event.name for event in exported.events] == ["mcp_sandbox.run.start"]
    assert (exported.status.status_code, exported.status.description) == (StatusCode.ERROR, "no such conversation")
    start_time, end_time = exported.start_time, exported.end_time
    assert start_time is not None and end_time is not None and start_time <= end_time
    provider.shutdown()


def test_an_exception_is_recorded_by_its_class_alone() -> None:
    exporter = InMemorySpanExporter()
    provider = _provider(exporter)
    opened = _pipeline(provider).start("call", None, SpanKind.INTERNAL, None)
    opened.record_exception(ValueError("secret-plant-2718"))
    opened.end()
    provider.shutdown()
    [exported] = exporter.get_finished_spans()
    assert dict(exported.attributes or {}) == {"error.type": "ValueError"} and not exported.events
    assert exported.parent is None and exported.context is not None and exported.context.trace_id != 0


@pytest.mark.parametrize("case", ["client not sampled", "always_off", "OTEL_TRACES_SAMPLER"])
def test_a_call_the_sampler_drops_makes_no_recording_span(case: str, monkeypatch: pytest.MonkeyPatch) -> None:
    exporter = InMemorySpanExporter()
    if case == "OTEL_TRACES_SAMPLER":
        monkeypatch.setenv("OTEL_TRACES_SAMPLER", "always_off")
    provider = _provider(exporter, sampler=ALWAYS_OFF) if case == "always_off" else _provider(exporter)
    opened = _pipeline(provider).start(
        "call", _parent("00" if case == "client not sampled" else "01"), SpanKind.SERVER, None
    )
    assert not opened.is_recording() and not isinstance(opened, OwnSpan)
    context = opened.get_span_context()
    assert format(context.trace_id, "032x") == TRACE_ID and not context.trace_flags.sampled
    opened.end()
    provider.shutdown()
    assert exporter.get_finished_spans() == ()


def test_shutdown_exports_what_is_queued_through_a_batch_processor() -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider(active_span_processor=OffLoop(tracing.SCOPE))
    provider.add_span_processor(BatchSpanProcessor(exporter, schedule_delay_millis=3_600_000))
    pipeline = _pipeline(provider)
    for index in range(50):
        pipeline.start(f"call {index}", None, SpanKind.SERVER, {"index": index}).end()
    provider.shutdown()
    assert [span.name for span in exporter.get_finished_spans()] == [f"call {index}" for index in range(50)]
    late = pipeline.start("after shutdown", None, SpanKind.SERVER, None)
    late.end()  # dropped, not kept
    assert isinstance(pipeline.sink, OffLoop) and not pipeline.sink._spans


def test_a_provider_without_the_own_pipeline_keeps_the_sdks_spans() -> None:
    assert pipeline_of(TracerProvider().get_tracer(tracing.SCOPE)) is None


@pytest.mark.parametrize(
    "traceparent",
    [
        f"00-{TRACE_ID}-{CLIENT_SPAN}",  # no flags
        f"00-{TRACE_ID[:-1]}-{CLIENT_SPAN}-01",  # a short trace id
        f"00-{'0' * 32}-{CLIENT_SPAN}-01",  # the invalid trace id
        f"ff-{TRACE_ID}-{CLIENT_SPAN}-01",  # the forbidden version
        f"00-{TRACE_ID.upper()}-{CLIENT_SPAN}-01",  # upper case
        f"00-{TRACE_ID}-{CLIENT_SPAN}-01-extra",  # more than version 00 has
        "00-code-plant-5b1f0c",
        "",
    ],
)
def test_a_malformed_traceparent_names_no_trace(traceparent: str) -> None:
    assert tracing.remote_parent({"traceparent": traceparent}) is None


class _Refusing(SpanProcessor):
    """A processor that fails on one span."""

    def on_end(self, span: ReadableSpan) -> None:
        if span.name == "refused":
            raise RuntimeError("this processor fails")


def test_a_processor_that_fails_on_a_span_loses_that_span_only() -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider(active_span_processor=OffLoop(tracing.SCOPE))
    provider.add_span_processor(_Refusing())
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    pipeline = _pipeline(provider)
    for name in ("before", "refused", "after"):
        pipeline.start(name, None, SpanKind.INTERNAL, None).end()
    provider.shutdown()
    assert [span.name for span in exporter.get_finished_spans()] == ["before", "after"]
