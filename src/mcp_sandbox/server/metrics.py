"""The server's Prometheus metrics: counters from the events, gauges read at each scrape.

Counters and histograms follow the events the engine, the bridge, the egress proxy and the routes emit (see
:mod:`mcp_sandbox.events`); gauges (queue, running runs, warm pool, sessions, bytes stored per
tenant) are read when scraped. Every server has its own :class:`CollectorRegistry`, never the
global one, so several servers (tests) live in one process. The route that serves them is
:mod:`.routes.metrics`.
"""

from __future__ import annotations

import collections
from collections.abc import Callable, Iterator
from typing import Any, ClassVar

from prometheus_client import CollectorRegistry, Counter, Histogram, disable_created_metrics, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from mcp_sandbox.events import (
    EgressConnection,
    Event,
    FileServed,
    FileStored,
    FilesUnsaved,
    PoolStarted,
    RunAdmitted,
    RunFinished,
    TaskChanged,
    ToolCalled,
)

__all__ = ["Metrics", "failure_cause", "stored_per_tenant"]

disable_created_metrics()  # type: ignore[no-untyped-call]  # no ``*_created`` series: nothing an operator reads, one more per series

_PREFIX = "mcp_sandbox"
# From half a millisecond: a warm run takes a few, and its percentiles must not all fall in one bucket.
_RUN_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)
_WAIT_BUCKETS = (0.0005, 0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 10, 30)
# The limits a run can hit (its result's ``limits``), by the cause a failure is counted under.
_LIMIT_CAUSES = (
    ("timeout", "timeout"),
    ("memory", "memory_limit"),
    ("pids", "pids_limit"),
    ("cpu", "cpu_limit"),
    ("file_size", "file_size_limit"),
    ("disk", "disk_limit"),
)


def failure_cause(event: RunFinished) -> str | None:
    """Why the run failed, in one word, or None when it did not: the first limit hit, else what else ended it."""
    if event.status == "busy":
        return "busy"
    for limit, cause in _LIMIT_CAUSES:
        if limit in event.limits or (limit == "timeout" and event.status == "timeout"):
            return cause
    if event.truncated:
        return "output_cap"
    if event.status == "success":
        return None
    if event.exit_code is not None and (event.exit_code < 0 or event.exit_code > 128):
        return "killed"  # a signal no limit explains
    return "error"


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
            f"{_PREFIX}_run_duration_seconds",
            "Run duration, by where the engine placed the run (path: warm, session, born, prestarted, fresh)",
            ["language", "backend", "path"],
            buckets=_RUN_BUCKETS,
            registry=r,
        )
        self.failures = Counter(
            f"{_PREFIX}_run_failures",
            "Runs that did not succeed (or lost output past the cap), by cause",
            ["cause", "language", "backend", "tenant"],
            registry=r,
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
        self.pool_starts = Counter(
            f"{_PREFIX}_pool_starts",
            "Sandboxes the pools started to keep ready (fills and refills): pool is warm, prestarted or ready",
            ["pool", "language"],
            registry=r,
        )
        self.limits = Counter(f"{_PREFIX}_limit_events", "Runs that hit a limit", ["limit"], registry=r)
        self.tool_calls = Counter(
            f"{_PREFIX}_tool_calls", "Downstream tool calls from sandboxed code", ["server", "outcome"], registry=r
        )
        self.tool_seconds = Histogram(
            f"{_PREFIX}_tool_call_duration_seconds", "Downstream tool call duration", ["server"], registry=r
        )
        self.egress = Counter(
            f"{_PREFIX}_egress_connections",
            "Connections through the egress proxy, by verdict (allowed, refused, cut) and the rule that decided",
            ["verdict", "rule", "tenant"],
            registry=r,
        )
        self.egress_bytes = Counter(
            f"{_PREFIX}_egress_bytes", "Bytes through the egress proxy (out: sent by runs)", ["direction"], registry=r
        )
        self.uploads = Counter(f"{_PREFIX}_uploads", "Uploads by outcome", ["via", "outcome"], registry=r)
        self.downloads = Counter(f"{_PREFIX}_downloads", "Signed downloads by outcome", ["outcome"], registry=r)
        self.transfer = Counter(f"{_PREFIX}_file_bytes", "Bytes uploaded and downloaded", ["direction"], registry=r)
        self.unsaved = Counter(
            f"{_PREFIX}_unsaved_files",
            "Files not in the object store as on disk: not stored by a write-back, or not got by a restore",
            ["stage"],
            registry=r,
        )
        self.tasks = Counter(
            f"{_PREFIX}_tasks",
            "MCP Tasks by the state they reached: working (created), completed, failed, cancelled",
            ["status", "tenant"],
            registry=r,
        )
        r.register(_Gauges(gauges, stored))
        # Every run's series, by their labels: `labels()` checks and converts them, under a lock, for each call.
        self._series: dict[tuple[str, ...], tuple[Any, Any]] = {}

    def _run_series(self, event: RunFinished) -> tuple[Any, Any]:
        """The run counter's and the duration histogram's series for ``event``'s labels."""
        key = (event.language, event.backend, event.status, event.tenant, event.path)
        series = self._series.get(key)
        if series is None:
            runs = self.runs.labels(event.language, event.backend, event.status, event.tenant)
            series = self._series[key] = (runs, self.run_seconds.labels(event.language, event.backend, event.path))
        return series

    def observe(self, event: Event) -> None:
        """Count ``event`` (an :class:`~mcp_sandbox.events.EventHub` observer)."""
        match event:
            case RunFinished():
                runs, seconds = self._run_series(event)
                runs.inc()
                if (cause := failure_cause(event)) is not None:
                    self.failures.labels(cause, event.language, event.backend, event.tenant).inc()
                if event.status != "busy":
                    seconds.observe(event.duration)
                    if event.conversation is None and event.language == "python":
                        self.warm.labels("hit" if event.warm else "miss").inc()
                for limit in event.limits:
                    self.limits.labels(limit).inc()
            case RunAdmitted():
                self.queue_wait.observe(event.wait)
            case ToolCalled():
                self.tool_calls.labels(event.server, event.outcome).inc()
                self.tool_seconds.labels(event.server).observe(event.duration)
            case EgressConnection():
                self.egress.labels(event.verdict, event.rule, event.tenant).inc()
                self.egress_bytes.labels("out").inc(event.sent)
                self.egress_bytes.labels("in").inc(event.received)
            case PoolStarted():
                self.pool_starts.labels(event.pool, event.language).inc()
            case FileStored():
                self.uploads.labels(event.via, event.outcome).inc()
                self.transfer.labels("in").inc(event.size)
            case FileServed():
                self.downloads.labels(event.outcome).inc()
                self.transfer.labels("out").inc(event.size)
            case FilesUnsaved():
                self.unsaved.labels(event.stage).inc(event.files)
            case TaskChanged():
                self.tasks.labels(event.status, event.tenant).inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)


class _Gauges(Collector):
    """What is true now, read at each scrape."""

    _HELP: ClassVar[dict[str, str]] = {
        "runs_running": "Runs holding a slot now",
        "queue_length": "Runs waiting for a slot now",
        "warm_pool_size": "Warm sandboxes (every host uid's) starting, idle or serving a run",
        "warm_pool_idle": "Warm sandboxes (every host uid's) idle now",
        "prestarted_size": "Pre-started sandboxes (all languages and host uids) starting, waiting or serving a run",
        "prestarted_idle": "Pre-started sandboxes (all languages and host uids) waiting for a run now",
        "sessions": "Live session interpreters",
        "draining": "1 while the server drains after SIGTERM",
        "ready": "1 while /readyz answers 200 (runs can be served now)",
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
