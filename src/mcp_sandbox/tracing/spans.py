"""This server's own spans: a few attribute stores on the event loop, made into the SDK's spans off it.

Why our own: the OpenTelemetry SDK's span creation (``start_span``: validated attributes under a
lock, the processors told at start, a ``ReadableSpan`` and the batch queue at end) took more of a
running server's event loop per warm traced run than tracing's whole budget: each SDK call costs
many times its tight-loop figure there, its code pushed out of the CPU's caches between runs
(bench/README.md's trace_cost section has the parts and the figures). An :class:`OwnSpan` stores
its name, ids, attributes, events and status in slots, and at its end hands itself to its
pipeline's sink (:class:`mcp_sandbox.tracing.records.OffLoop`), whose thread builds the SDK's
``ReadableSpan`` from it and gives it to the provider's processors.

What it keeps from the SDK: the provider's sampler decides at start (``OTEL_TRACES_SAMPLER``; a
call not recorded gets the API's non-recording span, as the SDK gives), its ``IdGenerator`` makes
the ids, its resource and this scope name the span, the SDK's span limits and attribute
validation apply (at conversion), and its processors and exporter export it: the OTLP wire output
is the SDK's. Only where the provider's span processor is an ``OffLoop`` (the pipeline
:mod:`.export` installs); under any other provider the SDK's own tracer makes the span, as before.
The processors hear of one of these spans at its end only (no ``on_start``). This module imports
only the OpenTelemetry API.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Final, NamedTuple, Protocol, cast

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace import Span, SpanContext, SpanKind, Status, StatusCode, TraceFlags
from opentelemetry.util import types

if TYPE_CHECKING:
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace.id_generator import IdGenerator
    from opentelemetry.sdk.trace.sampling import Sampler

__all__ = ["OwnSpan", "Pipeline", "Sink", "pipeline_of"]

_UNSET: Final = Status(StatusCode.UNSET)


class Sink(Protocol):
    """Where an ended :class:`OwnSpan` goes: taken at once, exported later (off the caller's thread)."""

    def hand(self, span: OwnSpan) -> None: ...


class Pipeline(NamedTuple):
    """What a provider gives this server's spans: its sampler, ids, resource, and the sink of its processors."""

    sampler: Sampler
    ids: IdGenerator
    resource: Resource
    sink: Sink

    def start(
        self, name: str, context: Context | None, kind: SpanKind, attributes: Mapping[str, types.AttributeValue] | None
    ) -> Span:
        """A span started as the SDK's tracer starts one (the sampler's decision, its ids and flags)."""
        parent: SpanContext | None = trace.get_current_span(context).get_span_context()
        if parent is None or not parent.is_valid:
            parent = None
            trace_id = self.ids.generate_trace_id()
        else:
            trace_id = parent.trace_id
        sampled = self.sampler.should_sample(context, trace_id, name, kind, attributes, ())
        decision = sampled.decision
        flags = TraceFlags.SAMPLED if decision.is_sampled() else TraceFlags.DEFAULT  # type: ignore[no-untyped-call]
        if self.ids.is_trace_id_random() if parent is None else parent.trace_flags.random_trace_id:
            flags |= TraceFlags.RANDOM_TRACE_ID
        own = SpanContext(trace_id, self.ids.generate_span_id(), False, TraceFlags(flags), sampled.trace_state)
        if not decision.is_recording():  # type: ignore[no-untyped-call]
            return trace.NonRecordingSpan(own)
        return OwnSpan(name, own, parent, kind, dict(sampled.attributes), self)


class OwnSpan(Span):
    """A recording span of this server: the OpenTelemetry API's ``Span``, its state in slots until it ends."""

    __slots__ = (
        "_attributes",
        "_context",
        "_end",
        "_events",
        "_kind",
        "_name",
        "_parent",
        "_pipeline",
        "_start",
        "_status",
    )

    def __init__(
        self,
        name: str,
        context: SpanContext,
        parent: SpanContext | None,
        kind: SpanKind,
        attributes: dict[str, Any],
        pipeline: Pipeline,
    ) -> None:
        self._name = name
        self._context = context
        self._parent = parent
        self._kind = kind
        self._attributes = attributes
        self._pipeline = pipeline
        self._events: list[tuple[str, types.Attributes, int]] = []
        self._status = _UNSET
        self._start = time.time_ns()
        self._end: int | None = None

    def end(self, end_time: int | None = None) -> None:
        if self._end is None:
            self._end = time.time_ns() if end_time is None else end_time
            self._pipeline.sink.hand(self)

    def get_span_context(self) -> SpanContext:
        return self._context

    def is_recording(self) -> bool:
        return self._end is None

    def set_attribute(self, key: str, value: types.AttributeValue) -> None:
        if self._end is None:
            self._attributes[key] = value

    def set_attributes(self, attributes: Mapping[str, types.AttributeValue]) -> None:
        if self._end is None:
            self._attributes.update(attributes)

    def add_event(self, name: str, attributes: types.Attributes = None, timestamp: int | None = None) -> None:
        if self._end is None:
            self._events.append((name, attributes, time.time_ns() if timestamp is None else timestamp))

    def add_link(self, context: SpanContext, attributes: types.Attributes = None) -> None:
        """Links are not kept: none of this server's spans has one."""

    def update_name(self, name: str) -> None:
        if self._end is None:
            self._name = name

    def set_status(self, status: Status | StatusCode, description: str | None = None) -> None:
        # As the SDK's span: an OK status is final, UNSET is never set; a Status object keeps its own description.
        if self._end is not None or self._status.status_code is StatusCode.OK:
            return
        if isinstance(status, StatusCode):
            status = Status(status, description)
        if status.status_code is not StatusCode.UNSET:
            self._status = status

    def record_exception(
        self,
        exception: BaseException,
        attributes: types.Attributes = None,
        timestamp: int | None = None,
        escaped: bool = False,
    ) -> None:
        """Only ``error.type``, the exception's class: its message and stack could quote the code or a secret."""
        self.set_attribute("error.type", type(exception).__qualname__)

    @property
    def attributes(self) -> Mapping[str, types.AttributeValue]:
        """The attributes set so far (the SDK's span has this property too)."""
        return self._attributes

    # Read by the sink's thread once the span has ended (nothing changes it then).
    @property
    def name(self) -> str:
        return self._name

    @property
    def parent(self) -> SpanContext | None:
        return self._parent

    @property
    def kind(self) -> SpanKind:
        return self._kind

    @property
    def events(self) -> Sequence[tuple[str, types.Attributes, int]]:
        return self._events

    @property
    def status(self) -> Status:
        return self._status

    @property
    def start_time(self) -> int:
        return self._start

    @property
    def end_time(self) -> int | None:
        return self._end

    @property
    def resource(self) -> Resource:
        return self._pipeline.resource


def pipeline_of(tracer: object) -> Pipeline | None:
    """The pipeline of an SDK tracer whose span processor takes this server's spans (a :class:`Sink`), else None."""
    sink = getattr(tracer, "span_processor", None)
    if not callable(getattr(sink, "hand", None)):
        return None
    sdk: Any = tracer
    return Pipeline(sdk.sampler, sdk.id_generator, sdk.resource, cast(Sink, sink))
