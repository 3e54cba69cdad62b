"""The export side of this server's own spans: the SDK's ``ReadableSpan`` built off the event loop.

:class:`OffLoop` is the tracer provider's span processor (a ``SynchronousMultiSpanProcessor``: the
processors added to the provider are its own). The SDK's spans (the MCP SDK's, of the requests this
server sends) reach its processors as ever; an ended :class:`~mcp_sandbox.tracing.spans.OwnSpan`
is handed to it (:meth:`OffLoop.hand`: one append on the event loop, no other thread woken) and
its thread, every :data:`INTERVAL`, turns what was handed into the SDK's ``ReadableSpan`` (the
span limits and attribute validation applied here) and gives each to the processors: a
``BatchSpanProcessor`` and its exporter do the rest. ``force_flush`` and ``shutdown`` first wait
for what was handed to reach the processors. Imported only where an SDK tracer provider is in use.
"""

from __future__ import annotations

import collections
import contextlib
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

# How often the thread takes the spans handed to it (the batch processor after it sends every 5 s by default),
# and how many waiting wake it sooner: no wake-up of another thread per span on the event loop.
INTERVAL: Final = 0.2
_WAKE_AT: Final = 512
# Spans waiting at most (a thread starved of the CPU): past it the oldest are dropped, as the batch processor
# after it drops spans past its own queue.
_MOST_WAITING: Final = 8192
logger = logging.getLogger(__name__)


class OffLoop(SynchronousMultiSpanProcessor):
    """The provider's span processor: this server's spans handed over as they end, made ``ReadableSpan`` s by a thread.

    ``scope``: the instrumentation scope the spans are exported under (this server's tracer's name).
    """

    def __init__(self, scope: str) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self._scope = InstrumentationScope(scope)
        self._limits = SpanLimits()  # the OTEL_SPAN_*/OTEL_ATTRIBUTE_* limits, as the SDK's spans read them
        self._spans: collections.deque[OwnSpan] = collections.deque(maxlen=_MOST_WAITING)
        self._flushes: queue.SimpleQueue[threading.Event] = queue.SimpleQueue()
        self._wake = threading.Event()
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._convert, name="otel-own-spans", daemon=True)
        self._thread.start()

    def hand(self, span: OwnSpan) -> None:
        """Take an ended span of this server's (called on the thread that ends it: an append, most times)."""
        if self._stopped.is_set():
            return  # shut down: nothing takes it any more (as the SDK's processors drop it)
        self._spans.append(span)
        if len(self._spans) >= _WAKE_AT:
            self._wake.set()

    def _convert(self) -> None:
        while True:
            self._wake.wait(INTERVAL)
            self._wake.clear()
            stopping = self._stopped.is_set()
            flushes: list[threading.Event] = []
            with contextlib.suppress(queue.Empty):
                while True:
                    flushes.append(self._flushes.get_nowait())
            while self._spans:  # every span handed before the flushes taken above, and maybe some after
                span = self._spans.popleft()
                try:
                    self.on_end(self._readable(span))
                except Exception:  # one span lost, not the thread: the spans after it still leave
                    logger.exception("a span could not be handed to the span processors")
            for reached in flushes:
                reached.set()
            if stopping:
                return

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
        self._flushes.put(reached)
        self._wake.set()
        return reached.wait(timeout_millis / 1000)

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        deadline = time.monotonic() + timeout_millis / 1000
        if not self._drained(timeout_millis):
            return False
        return super().force_flush(max(0, int((deadline - time.monotonic()) * 1000)))

    def shutdown(self) -> None:
        self._drained(30000)
        self._stopped.set()
        self._wake.set()
        self._thread.join()
        super().shutdown()
