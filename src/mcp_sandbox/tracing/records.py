"""The export side of this server's own spans: the SDK's ``ReadableSpan`` built off the event loop.

:class:`OffLoop` is the tracer provider's span processor (a ``SynchronousMultiSpanProcessor``: the
processors added to the provider are its own). The SDK's spans (the MCP SDK's, of the requests this
server sends) reach its processors as ever; an ended :class:`~mcp_sandbox.tracing.spans.OwnSpan`
is handed to it (:meth:`OffLoop.hand`: one queue put on the event loop) and its thread turns it
into the SDK's ``ReadableSpan`` (the span limits and attribute validation applied here) and gives
that to the processors: a ``BatchSpanProcessor`` and its exporter do the rest. ``force_flush`` and
``shutdown`` first wait for what is queued to reach the processors. Imported only where an SDK
tracer provider is in use.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from typing import Final

from opentelemetry.attributes import BoundedAttributes
from opentelemetry.sdk.trace import Event, ReadableSpan, SpanLimits, SynchronousMultiSpanProcessor
from opentelemetry.sdk.util import BoundedList
from opentelemetry.sdk.util.instrumentation import InstrumentationScope

from mcp_sandbox.tracing.spans import OwnSpan

__all__ = ["OffLoop"]

_STOP: Final = object()
logger = logging.getLogger(__name__)


class OffLoop(SynchronousMultiSpanProcessor):
    """The provider's span processor: this server's spans handed over as they end, made ``ReadableSpan`` s by a thread.

    ``scope``: the instrumentation scope the spans are exported under (this server's tracer's name).
    """

    def __init__(self, scope: str) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self._scope = InstrumentationScope(scope)
        self._limits = SpanLimits()  # the OTEL_SPAN_*/OTEL_ATTRIBUTE_* limits, as the SDK's spans read them
        self._queue: queue.SimpleQueue[object] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._convert, name="otel-own-spans", daemon=True)
        self._thread.start()

    def hand(self, span: OwnSpan) -> None:
        """Take an ended span of this server's (called on the thread that ends it: no more than a queue put)."""
        self._queue.put(span)

    def _convert(self) -> None:
        while (item := self._queue.get()) is not _STOP:
            if isinstance(item, threading.Event):
                item.set()  # a flush: everything handed before it has reached the processors
            elif isinstance(item, OwnSpan):
                try:
                    self.on_end(self._readable(item))
                except Exception:  # one span lost, not the thread: the spans after it still leave
                    logger.exception("a span could not be handed to the span processors")

    def _readable(self, span: OwnSpan) -> ReadableSpan:
        limits = self._limits
        longest = limits.max_attribute_length
        events = BoundedList.from_seq(
            limits.max_events,
            [
                Event(
                    name,
                    BoundedAttributes(
                        limits.max_event_attributes,
                        attributes,
                        immutable=True,
                        max_value_len=longest,
                    ),
                    timestamp,
                )
                for name, attributes, timestamp in span.events
            ],
        )
        return ReadableSpan(
            span.name,
            span.get_span_context(),
            span.parent,
            span.resource,
            BoundedAttributes(limits.max_span_attributes, span.attributes, immutable=True, max_value_len=longest),
            events,
            (),
            span.kind,
            None,
            span.status,
            span.start_time,
            span.end_time,
            self._scope,
        )

    def _drained(self, timeout_millis: float) -> bool:
        """Wait (at most ``timeout_millis``) until every span handed so far has reached the processors."""
        if not self._thread.is_alive():
            return True
        reached = threading.Event()
        self._queue.put(reached)
        return reached.wait(timeout_millis / 1000)

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        deadline = time.monotonic() + timeout_millis / 1000
        if not self._drained(timeout_millis):
            return False
        return super().force_flush(max(0, int((deadline - time.monotonic()) * 1000)))

    def shutdown(self) -> None:
        self._drained(30000)
        self._queue.put(_STOP)
        self._thread.join()
        super().shutdown()
