"""Spans of a traced call: what this server adds under the span of each request it serves.

Tracing is on when a process has installed an OpenTelemetry tracer provider (:mod:`.export`
does, where ``otel_endpoint`` is set). Each request the server serves then has a span, continuing
the client's ``_meta.traceparent`` (:mod:`.requests`), and the MCP SDK opens one for each request
it sends, putting ``traceparent`` into that request's ``_meta`` (a code-mode call to a downstream
server).

:func:`span` opens a child of the current span only while that one records: with tracing off
(or a call that is not sampled) it returns one shared empty context manager, makes no span
object and costs one context-variable lookup. A step that runs within the call it serves is told
on that call's span instead (:func:`step`; :func:`current`: an event, attributes), at a fraction
of a span's price; only work that may outlive its call (a task's run, :func:`background`) gets
spans of its own for its steps. Attributes are the callers' bounded values: names,
ports, verdicts, counts; never code, output, file contents, tokens or secret values. An exception
leaving a span sets ``error.type`` to its class name and no message (a message can quote the code);
a cancellation sets nothing.
The spans this server makes are its own (:mod:`.spans`: a few stores on the event loop, made the
SDK's spans off it by :mod:`.records`) where the provider's pipeline is the one :mod:`.export`
installs; under any other provider they are the installed tracer's (:func:`start`).
This module imports only the OpenTelemetry API, which the MCP SDK depends on.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator, Mapping
from types import TracebackType
from typing import Final

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.baggage.propagation import W3CBaggagePropagator
from opentelemetry.context import Context
from opentelemetry.trace import Span, SpanKind, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from mcp_sandbox.tracing.spans import Pipeline, pipeline_of

__all__ = [
    "AttributeValue",
    "Span",
    "SpanKind",
    "background",
    "context_of",
    "current",
    "enabled",
    "failed",
    "inject",
    "remote_parent",
    "span",
    "start",
    "step",
    "trace_id",
]

AttributeValue = str | bool | int | float

# The name of this server's instrumentation scope, its requests' spans included (the SDK's spans of the requests
# it sends are "mcp-python-sdk").
SCOPE: Final = "mcp_sandbox"

_tracer = trace.get_tracer(SCOPE)
_TRACE_CONTEXT: Final = TraceContextTextMapPropagator()
_BAGGAGE: Final = W3CBaggagePropagator()
_OFF: Final[contextlib.nullcontext[None]] = contextlib.nullcontext()
# Set in work that may outlive the span it started under (see background()).
_apart: Final = contextvars.ContextVar[bool]("mcp_sandbox_tracing_apart", default=False)


class _Known:
    """The tracer provider last seen and its pipeline for this server's own spans (None: the SDK's tracer's)."""

    __slots__ = ("pipeline", "provider")

    def __init__(self) -> None:
        self.provider: object = None
        self.pipeline: Pipeline | None = None


_known: Final = _Known()


def start(name: str, context: Context | None, kind: SpanKind, attributes: Mapping[str, AttributeValue] | None) -> Span:
    """A span of this server, started (not current): its own (:mod:`.spans`) where the provider's pipeline takes
    those, else the installed tracer's; recording or not as the provider's sampler decides."""
    provider = trace.get_tracer_provider()
    if provider is not _known.provider:
        _known.pipeline = pipeline_of(provider.get_tracer(SCOPE))
        _known.provider = provider
    if _known.pipeline is not None:
        return _known.pipeline.start(name, context, kind, attributes)
    # No record_exception: an exception's message and stack could quote the code or a secret.
    return _tracer.start_span(name, context, kind, attributes, record_exception=False, set_status_on_exception=False)


def span(
    name: str,
    attributes: Mapping[str, AttributeValue] | None = None,
    kind: SpanKind = SpanKind.INTERNAL,
    *,
    context: Context | None = None,
) -> contextlib.AbstractContextManager[Span | None]:
    """A child span of the current one for this block, yielded to set more attributes; None when not traced.

    ``context``: the parent to use instead of the current span (a request continued from a header).
    """
    if context is None and not trace.get_current_span().is_recording():
        return _OFF
    return _Recording(start(name, context, kind, attributes))


def step(name: str) -> contextlib.AbstractContextManager[Span | None]:
    """The span to tell a step of the current call on, for this block; None when not traced.

    The current span itself, where the step runs within it (a run awaited by the call it answers):
    its attributes and events go on that span, with no span of their own to make, end and export.
    Within :func:`background`, a child span named ``name``, as :func:`span` opens. An exception
    leaving the block marks whichever it is as :func:`span` does.
    """
    opened = trace.get_current_span()
    if not opened.is_recording():
        return _OFF
    if _apart.get():
        return _Recording(start(name, None, SpanKind.INTERNAL, None))
    return _Told(opened)


@contextlib.contextmanager
def background() -> Iterator[None]:
    """Mark what runs in this block as work that may outlive the current span (a task's run, answered after
    its call has returned): each :func:`step` in it opens a child span, since the call's span may end first."""
    token = _apart.set(True)
    try:
        yield
    finally:
        _apart.reset(token)


def failed(opened: Span, kind: type[BaseException]) -> None:
    """Mark ``opened`` as ended by an exception of class ``kind``: ``error.type`` and status ERROR, no message.
    A cancellation (no :class:`Exception`) is no error: a run's end closes its open connections."""
    if issubclass(kind, Exception):
        opened.set_attribute("error.type", kind.__qualname__)
        opened.set_status(StatusCode.ERROR)


class _Told:
    """A step told on a span that outlives it: the span yielded, marked if the step fails, not ended."""

    __slots__ = ("_span",)

    def __init__(self, opened: Span) -> None:
        self._span = opened

    def __enter__(self) -> Span:
        return self._span

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, traceback: TracebackType | None
    ) -> None:
        if kind is not None:
            failed(self._span, kind)


class _Recording:
    """A started span made current for a block and ended after it (what ``start_as_current_span`` does, in one
    object rather than three nested generators: this runs on every traced run)."""

    __slots__ = ("_span", "_token")

    def __init__(self, opened: Span) -> None:
        self._span = opened
        self._token: object = None

    def __enter__(self) -> Span:
        self._token = otel_context.attach(trace.set_span_in_context(self._span))
        return self._span

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, traceback: TracebackType | None
    ) -> None:
        try:
            if kind is not None:
                failed(self._span, kind)
        finally:
            otel_context.detach(self._token)  # type: ignore[arg-type]
            self._span.end()


def current() -> Span | None:
    """The current span while it records (to add an event or attributes to it), else None."""
    opened = trace.get_current_span()
    return opened if opened.is_recording() else None


def enabled() -> bool:
    """Whether this process exports traces (a tracer provider is installed)."""
    return not isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider)


def trace_id() -> str | None:
    """The current trace's id (32 hex digits) while a span records, else None (for audit lines and errors)."""
    current = trace.get_current_span()
    if not current.is_recording():
        return None
    return format(current.get_span_context().trace_id, "032x")


def inject(carrier: dict[str, str]) -> None:
    """Put the current span's W3C ``traceparent`` (and ``tracestate``, ``baggage``) into ``carrier`` while traced."""
    if trace.get_current_span().is_recording():
        _TRACE_CONTEXT.inject(carrier)
        _BAGGAGE.inject(carrier)


def context_of(carrier: Mapping[str, str]) -> Context | None:
    """The trace context a ``traceparent`` in ``carrier`` names, where tracing is on and it is valid; else None."""
    if not enabled():
        return None
    return remote_parent(carrier)


def remote_parent(carrier: Mapping[str, object]) -> Context | None:
    """The trace context a valid W3C ``traceparent`` in ``carrier`` names (with its ``tracestate`` and ``baggage``),
    else None: a span started under None continues the current one or starts a trace.

    The W3C propagators themselves, not the configured composite (``OTEL_PROPAGATORS``): ``_meta`` and the
    forwarding header carry W3C trace context by definition (as :func:`inject` writes it). A value of the
    wrong type (the propagators expect strings) names no trace.
    """
    if "traceparent" not in carrier:
        return None
    try:
        extracted = _TRACE_CONTEXT.extract(carrier)
        if "baggage" in carrier:
            extracted = _BAGGAGE.extract(carrier, extracted)
    except (ValueError, TypeError, AttributeError):
        return None
    return extracted if trace.get_current_span(extracted).get_span_context().is_valid else None
