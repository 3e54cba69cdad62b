"""The server's Prometheus metrics: counters from the events, gauges read at each scrape.

Counters and histograms follow the events the engine, the bridge and the routes emit (see
:mod:`mcp_sandbox.events`); gauges (queue, running runs, warm pool, sessions, bytes stored per
tenant) are read when scraped. Every server has its own :class:`CollectorRegistry`, never the
global one, so several servers (tests) live in one process. The route that serves them is
:mod:`.routes.metrics`.
"""

from __future__ import annotations

import collections
from collections.abc import Callable, Iterator
from typing import Any, ClassVar

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from mcp_sandbox.events import Event, FileServed, FileStored, RunAdmitted, RunFinished, ToolCalled

__all__ = ["Metrics", "stored_per_tenant"]

_PREFIX = "mcp_sandbox"
_RUN_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)
_WAIT_BUCKETS = (0.0005, 0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 10, 30)


class Metrics:
    """The server's metrics: one registry, the event counters, and the gauges read at scrape time."""

    def __init__(self, gauges: Callable[[], dict[str, float]], stored: Callable[[], dict[str, int]]) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.runs = Counter(
            f"{_PREFIX}_runs",
            "Runs by language, backend, status and tenant",
            ["language", "backend", "status", "tenant"],
            registry=r,
        )
        self.run_seconds = Histogram(
            f"{_PREFIX}_run_duration_seconds", "Run duration", ["language", "backend"], buckets=_RUN_BUCKETS, registry=r
        )
        self.queue_wait = Histogram(
            f"{_PREFIX}_queue_wait_seconds", "Time runs waited for a slot", buckets=_WAIT_BUCKETS, registry=r
        )
        self.warm = Counter(
            f"{_PREFIX}_warm_pool_runs",
            "Runs without a conversation: served warm (hit) or cold (miss)",
            ["result"],
            registry=r,
        )
        self.limits = Counter(f"{_PREFIX}_limit_events", "Runs that hit a limit", ["limit"], registry=r)
        self.tool_calls = Counter(
            f"{_PREFIX}_tool_calls", "Downstream tool calls from sandboxed code", ["server", "outcome"], registry=r
        )
        self.tool_seconds = Histogram(
            f"{_PREFIX}_tool_call_duration_seconds", "Downstream tool call duration", ["server"], registry=r
        )
        self.uploads = Counter(f"{_PREFIX}_uploads", "Uploads by outcome", ["via", "outcome"], registry=r)
        self.downloads = Counter(f"{_PREFIX}_downloads", "Signed downloads by outcome", ["outcome"], registry=r)
        self.transfer = Counter(f"{_PREFIX}_file_bytes", "Bytes uploaded and downloaded", ["direction"], registry=r)
        r.register(_Gauges(gauges, stored))

    def observe(self, event: Event) -> None:
        """Count ``event`` (an :class:`~mcp_sandbox.events.EventHub` observer)."""
        match event:
            case RunFinished():
                self.runs.labels(event.language, event.backend, event.status, event.tenant).inc()
                if event.status != "busy":
                    self.run_seconds.labels(event.language, event.backend).observe(event.duration)
                    if event.conversation is None and event.language == "python":
                        self.warm.labels("hit" if event.warm else "miss").inc()
                for limit in event.limits:
                    self.limits.labels(limit).inc()
            case RunAdmitted():
                self.queue_wait.observe(event.wait)
            case ToolCalled():
                self.tool_calls.labels(event.server, event.outcome).inc()
                self.tool_seconds.labels(event.server).observe(event.duration)
            case FileStored():
                self.uploads.labels(event.via, event.outcome).inc()
                self.transfer.labels("in").inc(event.size)
            case FileServed():
                self.downloads.labels(event.outcome).inc()
                self.transfer.labels("out").inc(event.size)

    def render(self) -> bytes:
        return generate_latest(self.registry)


class _Gauges(Collector):
    """What is true now, read at each scrape."""

    _HELP: ClassVar[dict[str, str]] = {
        "runs_running": "Runs holding a slot now",
        "queue_length": "Runs waiting for a slot now",
        "warm_pool_size": "Warm sandboxes starting, idle or serving a run",
        "warm_pool_idle": "Warm sandboxes idle now",
        "sessions": "Live session interpreters",
        "draining": "1 while the server drains after SIGTERM",
    }

    def __init__(self, gauges: Callable[[], dict[str, float]], stored: Callable[[], dict[str, int]]) -> None:
        self._gauges = gauges
        self._stored = stored

    def describe(self) -> Iterator[Any]:
        return iter(())  # collected at scrape time only: nothing to check at registration

    def collect(self) -> Iterator[GaugeMetricFamily]:
        for name, value in self._gauges().items():
            yield GaugeMetricFamily(f"{_PREFIX}_{name}", self._HELP.get(name, name), value=value)
        stored = GaugeMetricFamily(
            f"{_PREFIX}_stored_bytes", "Bytes stored in conversations' workspaces, per tenant", labels=["tenant"]
        )
        for tenant, size in sorted(self._stored().items()):
            stored.add_metric([tenant], size)
        yield stored


def stored_per_tenant(rows: Iterator[tuple[str, int]]) -> dict[str, int]:
    """Sum (tenant, bytes) rows per tenant."""
    totals: collections.Counter[str] = collections.Counter()
    for tenant, size in rows:
        totals[tenant] += size
    return dict(totals)
