"""Spans of a traced call: the children this server adds under the MCP SDK's span of each request.

Tracing is on when a process has installed an OpenTelemetry tracer provider (:mod:`.export`
does, where ``otel_endpoint`` is set). The MCP SDK then opens a span for each request it serves,
continuing the client's ``_meta.traceparent``, and one for each request it sends, putting
``traceparent`` into that request's ``_meta`` (a code-mode call to a downstream server).

:func:`span` opens a child of the current span only while that one records: with tracing off
(or a call that is not sampled) it returns one shared empty context manager, makes no span
object and costs one context-variable lookup. A step that would cover nearly the same time as the
span it runs under is told on that span instead (:func:`current`: an event, attributes), at a
fraction of a span's price. Attributes are the callers' bounded values: names,
ports, verdicts, counts; never code, output, file contents, tokens or secret values. An exception
leaving a span sets ``error.type`` to its class name and no message (a message can quote the code);
a cancellation sets nothing.
This module imports only the OpenTelemetry API, which the MCP SDK depends on.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from types import TracebackType
from typing import Final

from opentelemetry import context as otel_context
from opentelemetry import propagate, trace
from opentelemetry.context import Context
from opentelemetry.trace import Span, SpanKind, StatusCode

__all__ = ["AttributeValue", "Span", "SpanKind", "context_of", "current", "enabled", "inject", "span", "trace_id"]

AttributeValue = str | bool | int | float

# The name of this server's instrumentation scope (the SDK's own spans are "mcp-python-sdk").
SCOPE: Final = "mcp_sandbox"

_tracer = trace.get_tracer(SCOPE)
_OFF: Final[contextlib.nullcontext[None]] = contextlib.nullcontext()


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
    # No record_exception: an exception's message and stack could quote the code or a secret.
    return _Recording(_tracer.start_span(name, context, kind, attributes, record_exception=False))


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
            # Not a cancellation: the block's owner ended it (a run's end closes its open connections).
            if kind is not None and issubclass(kind, Exception):
                self._span.set_attribute("error.type", kind.__qualname__)
                self._span.set_status(StatusCode.ERROR)
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
        propagate.inject(carrier)


def context_of(carrier: Mapping[str, str]) -> Context | None:
    """The trace context a ``traceparent`` in ``carrier`` names, where tracing is on and it is valid; else None."""
    if "traceparent" not in carrier or not enabled():
        return None
    try:
        extracted = propagate.extract(carrier)
    except (ValueError, TypeError):
        return None
    return extracted if trace.get_current_span(extracted).get_span_context().is_valid else None
