"""The running service: engine, bridge, workspaces, metadata and URL signing, opened together.

:func:`open_service` owns them all for the server's lifetime (stdio or HTTP): it checks the
backend, opens the metadata database, loads (or creates) the server secret, sweeps retention
at start and then periodically, and closes sessions and downstream servers on the way out.
It also owns what watches the service: the event hub the engine, the bridge and the routes
emit to, the metrics and the audit log subscribed to it, and the lifecycle (drain, reload).
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import gc
import logging
import time
from collections.abc import AsyncIterator, Callable, Collection, Iterator
from dataclasses import dataclass
from pathlib import Path

import anyio
import anyio.from_thread
import anyio.to_thread
from anyio.abc import TaskGroup

from mcp_sandbox.audit import AuditLog
from mcp_sandbox.bridge.discovery import Discovery, discover
from mcp_sandbox.bridge.mediator import Mediator, open_mediator
from mcp_sandbox.config import Settings
from mcp_sandbox.egress import TenantEgress
from mcp_sandbox.engine import Engine
from mcp_sandbox.engine.startup import open_engine
from mcp_sandbox.errors import WorkspaceError
from mcp_sandbox.events import Event, EventHub, FileServed, FileStored, RunFinished, ToolCalled
from mcp_sandbox.provision import js_status
from mcp_sandbox.server.lifecycle import Lifecycle
from mcp_sandbox.server.metrics import Metrics, stored_per_tenant
from mcp_sandbox.server.urls import UrlSigner
from mcp_sandbox.state import StateLayout
from mcp_sandbox.workspace import (
    ExecutionRecord,
    FileEntry,
    Metadata,
    WorkspaceStore,
    derive_key,
    load_secret,
    sweep,
)

__all__ = ["RETENTION_INTERVAL", "Service", "open_service"]

logger = logging.getLogger(__name__)

RETENTION_INTERVAL = 300.0  # the default of settings.retention_interval (a sweep also runs at start)
# How long the history waits before writing a run's record: past its answer, and gathering the
# records of the runs that end meanwhile into the same transaction.
HISTORY_DELAY = 0.05


@dataclass
class Service:
    """Everything a tool call or a file route needs. ``http``: download URLs exist."""

    settings: Settings
    engine: Engine
    bridge: Mediator
    workspaces: WorkspaceStore
    metadata: Metadata
    urls: UrlSigner
    http: bool
    # Each tenant's egress rules, checked once at start (a malformed pattern refuses to start).
    egress: TenantEgress
    events: EventHub = dataclasses.field(default_factory=EventHub)
    lifecycle: Lifecycle = dataclasses.field(default_factory=Lifecycle)
    metrics: Metrics | None = None

    in_use: collections.Counter[str] = dataclasses.field(default_factory=collections.Counter)
    # Where history writes run after their call has been answered (open_service waits for them).
    writes: TaskGroup | None = None
    _history: list[ExecutionRecord] = dataclasses.field(default_factory=list, init=False, repr=False)  # unwritten
    _writing: bool = dataclasses.field(default=False, init=False, repr=False)  # a task of writes is at it

    @contextlib.contextmanager
    def using(self, key: str | None) -> Iterator[None]:
        """Mark a conversation busy for the block, so retention spares it."""
        if key is None:
            yield
            return
        self.in_use[key] += 1
        try:
            yield
        finally:
            self.in_use[key] -= 1
            if not self.in_use[key]:
                del self.in_use[key]

    def file_url(self, key: str, name: str) -> str | None:
        return self.urls.file_url(key, name, time.time()) if self.http else None

    def file_base_url(self, key: str) -> str | None:
        return self.urls.base_url(key, time.time()) if self.http else None

    async def touch(self, key: str, tenant: str) -> Path:
        """Create the conversation's directory if needed and mark it used now."""
        directory = await anyio.to_thread.run_sync(self.workspaces.ensure, key)
        await anyio.to_thread.run_sync(self.metadata.touch_conversation, key, tenant, time.time())
        return directory

    async def refresh_files(self, key: str) -> list[FileEntry]:
        """List the conversation's files (never following the sandbox's symlinks) and record them."""
        listing = await anyio.to_thread.run_sync(self.workspaces.list_files, key)
        await anyio.to_thread.run_sync(self.metadata.record_files, key, listing)
        return list(listing)

    async def record(self, record: ExecutionRecord) -> None:
        await anyio.to_thread.run_sync(self.metadata.record_execution, record)

    def metrics_or_fail(self) -> Metrics:
        """The metrics :func:`open_service` made (a Service built by hand has none)."""
        if self.metrics is None:
            raise RuntimeError("this service was not opened with open_service: it has no metrics")
        return self.metrics

    def ready(self) -> bool:
        """Whether runs can be served now: not draining, and the warm pool up where there is one."""
        if self.lifecycle.draining:
            return False
        engine = self.engine
        if not engine.backend.warm_pool or self.settings.pool_min == 0:
            return True
        return engine.pool.up > 0

    def gauges(self) -> dict[str, float]:
        """What the metrics read at each scrape (called from a worker thread: plain reads only)."""
        engine = self.engine
        return {
            "runs_running": engine.admission.running,
            "queue_length": engine.admission.waiting,
            "warm_pool_size": engine.pool.size,
            "warm_pool_idle": engine.pool.idle,
            "sessions": len(engine.live_sessions()),
            "draining": float(self.lifecycle.draining),
        }

    def stored(self) -> dict[str, int]:
        """Bytes stored per tenant, as the metadata index last recorded them."""
        return stored_per_tenant((row.tenant, row.bytes) for row in self.metadata.conversations_by_last_use())

    async def reload_servers(self) -> list[str]:
        """Re-read the downstream servers' tool allow/deny lists (SIGHUP)."""
        fresh = await anyio.to_thread.run_sync(discover, self.settings)
        return self.bridge.reload_policies(fresh)

    def record_soon(self, record: ExecutionRecord) -> None:
        """Add ``record`` to the history after the call is answered (off its path); a failure is logged.

        It is written :data:`HISTORY_DELAY` later, with the records that came meanwhile, in one
        transaction (one worker thread hop for them all): the write never competes with the
        answer it follows, and under load the history costs a fraction of a run. Closing the
        service waits for the last ones.
        """
        if self.writes is None:
            raise RuntimeError("the service is not open (see open_service)")
        self._history.append(record)
        if not self._writing:
            self._writing = True
            self.writes.start_soon(self._write_history)

    async def _write_history(self) -> None:
        try:
            with anyio.CancelScope(shield=True):  # bounded: a short wait, then writes that always end
                await anyio.sleep(HISTORY_DELAY)
                while self._history:
                    batch = list(self._history)
                    self._history.clear()
                    try:
                        await anyio.to_thread.run_sync(self._record_all, batch)
                    except Exception:  # losing metadata rows must not lose the runs' results
                        logger.exception("could not record %d executions in the metadata database", len(batch))
        finally:
            self._writing = False

    def _record_all(self, batch: list[ExecutionRecord]) -> None:
        try:
            self.metadata.record_executions(batch)
        except WorkspaceError:
            if len(batch) == 1:
                raise
            for record in batch:  # one bad row spoils only itself
                try:
                    self.metadata.record_execution(record)
                except WorkspaceError:
                    logger.exception("could not record an execution in the metadata database")

    async def sweep(self) -> None:
        """Apply the retention policy now; conversations with a live session or run are spared."""
        report = await anyio.to_thread.run_sync(
            lambda: sweep(self.workspaces, self.metadata, self.settings, time.time(), _Busy(self))
        )
        if report.removed or report.failed:
            logger.info("retention: %s", report.summary())


class _Busy(Collection[str]):
    """The conversations in use, read live from the sweep's worker thread.

    Retention checks each conversation just before deleting it; the answer is computed on the
    event loop, which owns the sessions and the in-use counts.
    """

    def __init__(self, service: Service) -> None:
        self._service = service

    def _snapshot(self) -> set[str]:
        return set(self._service.engine.live_sessions()) | set(self._service.in_use)

    def _keys(self) -> set[str]:
        return anyio.from_thread.run_sync(self._snapshot)

    def __contains__(self, key: object) -> bool:
        return key in self._keys()

    def __iter__(self) -> Iterator[str]:
        return iter(self._keys())

    def __len__(self) -> int:
        return len(self._keys())


# Audit lines: event name and the event's own fields (sizes, times, names, outcomes; see events.py).
_AUDITED: dict[type, str] = {RunFinished: "run", ToolCalled: "tool_call", FileStored: "upload", FileServed: "download"}


def _auditor(log: AuditLog) -> Callable[[Event], None]:
    def record(event: Event) -> None:
        name = _AUDITED.get(type(event))
        if name is not None:
            # The fields as they are (strings, numbers, tuples of strings): asdict's deep copy is not needed.
            log.record(name, **{field.name: getattr(event, field.name) for field in dataclasses.fields(event)})

    return record


async def _sweep_periodically(service: Service) -> None:
    while True:
        try:
            await service.sweep()
        except OSError as exc:
            logger.error("retention sweep failed: %s", exc)
        await anyio.sleep(service.settings.retention_interval)


@contextlib.asynccontextmanager
async def open_service(settings: Settings, *, http: bool, discovery: Discovery | None = None) -> AsyncIterator[Service]:
    """Open the whole service; everything is closed (bounded) when the block exits.

    ``discovery`` replaces the discovery of downstream servers (tests use it).

    Raises:
        ConfigError, BackendUnavailableError: the configuration or the host cannot serve.
    """
    layout = StateLayout.of(settings)
    egress = TenantEgress(settings)
    # In a worker thread: probing the backend runs processes, and the event loop may be serving.
    events = EventHub()
    engine = await anyio.to_thread.run_sync(open_engine, settings, events)
    js = js_status(settings)
    if js.problem is not None:
        logger.warning("TypeScript/JavaScript runs will fail: %s", js.advice())
    secret = load_secret(layout.root)
    workspaces = WorkspaceStore(settings, secret)
    metadata = Metadata.open(layout.metadata)
    audit = AuditLog.open(layout.audit_log)
    events.subscribe(_auditor(audit))
    try:
        urls = UrlSigner(derive_key(secret, "download-url"), settings.base_url, settings.url_ttl)
        async with (
            open_mediator(settings, discovery, events) as bridge,
            engine.running(),
            anyio.create_task_group() as group,
            anyio.create_task_group() as writes,  # never cancelled: its exit waits for the last writes
        ):
            service = Service(settings, engine, bridge, workspaces, metadata, urls, http, egress, events, writes=writes)
            service.metrics = Metrics(service.gauges, service.stored)
            events.subscribe(service.metrics.observe)
            service.lifecycle.on_reload("servers", service.reload_servers)
            group.start_soon(_sweep_periodically, service)
            # What is alive now (the SDK's and pydantic's models, the engine) lives as long as the
            # service: the cyclic GC stops walking it. Its full collections took ~70 ms of a run
            # every few hundred runs here, and each younger one less.
            gc.freeze()
            try:
                yield service
            finally:
                gc.unfreeze()
                group.cancel_scope.cancel()
    finally:
        audit.close()
        metadata.close()
