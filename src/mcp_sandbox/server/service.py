"""The running service: engine, code mode's mediator, workspaces, metadata and URL signing, opened together.

:func:`open_service` owns them all for the server's lifetime (stdio or HTTP): it checks the
backend, opens the metadata database, loads (or creates) the server secret, sweeps retention
at start and then periodically, and closes sessions and downstream servers on the way out.
Small openers build the parts first (the stores, the replication, the observers: the event
hub's metrics, audit log and run history), then :class:`Service` is built once with all it
owns; nothing is assigned to it later. With ``replica_url``, it holds the replica's leases and
forwarding (:mod:`mcp_sandbox.replicas`), given back on drain and at the end.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import gc
import logging
import time
from collections.abc import AsyncIterator, Awaitable
from dataclasses import dataclass
from typing import Any, NamedTuple

import anyio
import anyio.to_thread
from anyio.abc import TaskGroup

from mcp_sandbox.audit import AuditLog, Tally
from mcp_sandbox.bridge.discovery import Discovery, discover
from mcp_sandbox.bridge.mediator import Mediator, open_mediator
from mcp_sandbox.config import Settings
from mcp_sandbox.egress import TenantEgress
from mcp_sandbox.engine import Engine
from mcp_sandbox.engine.parking import ParkedStates
from mcp_sandbox.engine.startup import open_engine
from mcp_sandbox.errors import WorkspaceError
from mcp_sandbox.events import EventHub
from mcp_sandbox.provision import js_status
from mcp_sandbox.replicas.checkpoints import StoredCheckpoints
from mcp_sandbox.replicas.forward import Router
from mcp_sandbox.replicas.idle_writes import IdleWrites, flushed
from mcp_sandbox.replicas.leases import Leases
from mcp_sandbox.replicas.mirror import Mirror
from mcp_sandbox.replicas.opening import open_mirror
from mcp_sandbox.replicas.parked import StoredParked
from mcp_sandbox.replicas.running import open_replica, replica_leases
from mcp_sandbox.replicas.shared_secret import load_shared_secret
from mcp_sandbox.sandbox.backends.base import Backend
from mcp_sandbox.server.audit_trail import REFUSALS_INTERVAL, auditor, flush_periodically
from mcp_sandbox.server.busy import Busy
from mcp_sandbox.server.history import History
from mcp_sandbox.server.lifecycle import Lifecycle
from mcp_sandbox.server.metrics import Metrics, stored_per_tenant
from mcp_sandbox.server.storage import Storage
from mcp_sandbox.server.tasks.remote import RemoteTasks
from mcp_sandbox.server.tasks.runtime import MAX_TTL_MS, Tasks
from mcp_sandbox.server.tasks.table import TaskTable
from mcp_sandbox.server.urls import UrlSigner
from mcp_sandbox.state import StateLayout
from mcp_sandbox.workspace import Metadata, WorkspaceStore, derive_key, load_secret, sweep
from mcp_sandbox.workspace.checkpoints import Checkpoints
from mcp_sandbox.workspace.runner_data import RunnerData, import_runner_data

__all__ = ["RETENTION_INTERVAL", "Service", "open_service"]

logger = logging.getLogger(__name__)

RETENTION_INTERVAL = 300.0  # the default of settings.retention_interval (a sweep also runs at start)


@dataclass(frozen=True)
class Service:
    """Everything a tool call or a file route needs, built once by :func:`open_service`. ``http``:
    download URLs exist."""

    settings: Settings
    engine: Engine
    mediator: Mediator
    # The conversations' files and records; each step in a worker thread.
    storage: Storage
    urls: UrlSigner
    http: bool
    # Each tenant's egress rules, checked once at start (a malformed pattern refuses to start).
    egress: TenantEgress
    events: EventHub
    lifecycle: Lifecycle
    metrics: Metrics
    # Which conversations are busy here: retention and the leases leave them alone.
    busy: Busy
    # With replica_url: which replica runs each conversation, and the forwarding to it.
    router: Router | None
    # The server secret (shared through the database when database_url is set): keys derive from it.
    secret: bytes = dataclasses.field(repr=False)
    # Tool calls run as MCP Tasks (server/tasks), kept in the metadata database.
    tasks: Tasks
    # Parked interpreter states (sessions idle, and checkpoints' variables), signed; with replicas, in the store too.
    parked: ParkedStates
    # Checkpoints' files (workspace/checkpoints.py).
    checkpoints: Checkpoints

    @property
    def workspaces(self) -> WorkspaceStore:
        return self.storage.workspaces

    @property
    def metadata(self) -> Metadata:
        return self.storage.metadata

    @property
    def mirror(self) -> Mirror | None:
        """The workspaces' copy in the object store (object_store_url), else None: local disk only."""
        return self.storage.mirror

    @property
    def runner_data(self) -> RunnerData | None:
        """The earlier code runner's data, imported at start (its SANDBOX_ROOT and FILE_SECRET set)."""
        return self.storage.runner_data

    def using(self, key: str | None) -> contextlib.AbstractContextManager[None]:
        """Mark a conversation busy for the block, so retention spares it (:meth:`.Busy.using`)."""
        return self.busy.using(key)

    def file_url(self, key: str, name: str) -> str | None:
        return self.urls.file_url(key, name, time.time()) if self.http else None

    def file_base_url(self, key: str) -> str | None:
        return self.urls.base_url(key, time.time()) if self.http else None

    def ready(self) -> bool:
        """Whether runs can be served now: not draining, and the warm pool up where there is one."""
        return _ready(self.engine, self.lifecycle, self.settings.pool.pool_min)

    async def reload_servers(self) -> list[str]:
        """Re-read the downstream servers' tool allow/deny lists (SIGHUP)."""
        fresh = await anyio.to_thread.run_sync(discover, self.settings.replace(config_read=None))  # read anew
        return self.mediator.reload_policies(fresh)

    async def sweep(self) -> None:
        """Apply the retention policy now; conversations busy here, or leased by any replica, are spared."""
        forget = None if self.mirror is None else self.mirror.forget
        try:
            leased = set() if self.router is None else await anyio.to_thread.run_sync(self.router.leases.live)
        except WorkspaceError as exc:
            logger.warning("retention skipped: the conversations other replicas use cannot be read: %s", exc)
            return
        busy = self.busy.from_thread(leased)
        report = await anyio.to_thread.run_sync(
            lambda: sweep(self.workspaces, self.metadata, self.settings.workspaces, time.time(), busy, forget)
        )
        if report.removed or report.failed or report.history_pruned:
            logger.info("retention: %s", report.summary())


def _ready(engine: Engine, lifecycle: Lifecycle, pool_min: int) -> bool:
    if lifecycle.draining:
        return False
    if not engine.backend.warm_pool or pool_min == 0:
        return True
    return engine.pool.up > 0


def _gauges(engine: Engine, lifecycle: Lifecycle, pool_min: int) -> dict[str, float]:
    """What the metrics read at each scrape (called from a worker thread: plain reads only)."""
    return {
        "runs_running": engine.admission.running,
        "queue_length": engine.admission.waiting,
        "warm_pool_size": engine.pools.warm_size,  # every host uid's together: no tenant's name in a label
        "warm_pool_idle": engine.pools.warm_idle,
        "prestarted_size": engine.pools.prestarted_size,
        "prestarted_idle": engine.pools.prestarted_ready,
        "sessions": len(engine.live_sessions()),
        "draining": float(lifecycle.draining),
        "ready": float(_ready(engine, lifecycle, pool_min)),
    }


def _stored(metadata: Metadata) -> dict[str, int]:
    """Bytes stored per tenant, as the metadata index last recorded them."""
    return stored_per_tenant((row.tenant, row.bytes) for row in metadata.conversations_by_last_use())


async def _sweep_periodically(service: Service) -> None:
    while True:
        try:
            await service.sweep()
        except OSError as exc:
            logger.error("retention sweep failed: %s", exc)
        await anyio.sleep(service.settings.workspaces.retention_interval)


async def _parked_then(engine: Engine | None, then: Awaitable[None]) -> None:
    """Park ``engine``'s idle sessions (none: no object store to park them for another replica), then
    ``then``: a replica's leases are given back with their states in the store, never before."""
    if engine is not None:
        await engine.park_sessions()
    await then


async def _open_engine(settings: Settings, events: EventHub, backend: Backend | None, **shared: Any) -> Engine:
    if backend is not None:
        engine = Engine(settings, backend, events, **shared)
        engine.prepare()
        return engine
    # In a worker thread: probing the backend runs processes, and the event loop may be serving.
    return await anyio.to_thread.run_sync(functools.partial(open_engine, settings, events, **shared))


class _Stores(NamedTuple):
    metadata: Metadata
    secret: bytes
    workspaces: WorkspaceStore
    mirror: Mirror | None


@contextlib.asynccontextmanager
async def _open_stores(settings: Settings, layout: StateLayout, engine: Engine) -> AsyncIterator[_Stores]:
    """The metadata index, the server secret, the workspaces and their object-store copy; closed at the end."""
    # In a worker thread: a PostgreSQL database (database_url) is reached over the network.
    metadata = await anyio.to_thread.run_sync(Metadata.open, layout.metadata, settings.replicas.database_url)
    logger.info("metadata index: %s", metadata.description)
    mirror = None
    try:
        try:  # with database_url, servers share the secret in the database
            shared = settings.replicas.database_url is not None
            secret = await anyio.to_thread.run_sync(
                lambda: load_shared_secret(metadata.database, layout.root) if shared else load_secret(layout.root)
            )
            # One change lock per conversation, one layout and one table of tenants' uids, shared with the engine.
            workspaces = WorkspaceStore(settings, secret, engine.gate, engine.tenant_uids)
            if swept := await anyio.to_thread.run_sync(workspaces.sweep_partials):
                logger.info("deleted %d partial uploads a crash left", swept)
            if settings.replicas.object_store_url is not None:
                mirror = await anyio.to_thread.run_sync(open_mirror, settings.replicas, workspaces)
        except BaseException:
            metadata.close()
            raise
        try:
            yield _Stores(metadata, secret, workspaces, mirror)
        finally:
            metadata.close()
    finally:
        if mirror is not None:
            mirror.objects.close()


@contextlib.asynccontextmanager
async def _replication(
    settings: Settings, leases: Leases | None, secret: bytes, storage: Storage, idle: IdleWrites | None
) -> AsyncIterator[Router | None]:
    """The replica's router (None: one server); on the way out, the last idle write-backs, then the
    leases given back."""
    async with contextlib.AsyncExitStack() as stack:
        router = None
        if leases is not None:
            router = await stack.enter_async_context(open_replica(settings, leases, secret, storage.restore_files))
        if idle is not None:  # after the sessions are closed, before the leases are given back
            stack.push_async_callback(idle.flush)
        yield router


def _observers(
    settings: Settings, engine: Engine, lifecycle: Lifecycle, metadata: Metadata, events: EventHub, writes: TaskGroup
) -> Metrics:
    """The metrics and the run history, subscribed to ``events`` (history written in ``writes``)."""
    pool_min = settings.pool.pool_min
    metrics = Metrics(functools.partial(_gauges, engine, lifecycle, pool_min), functools.partial(_stored, metadata))
    events.subscribe(metrics.observe)
    events.subscribe(History(metadata, writes).observe)
    return metrics


def _tasks(
    settings: Settings, table: TaskTable, group: TaskGroup, ttl_ms: int, events: EventHub, router: Router | None
) -> Tasks:
    """The server's tasks; with replicas each names its replica, which any other asks about it
    (:mod:`.tasks.remote`), and a replica's death fails its tasks within ``replica_lease``."""
    if router is None:
        return Tasks(table, group, max_ttl_ms=ttl_ms, emit=events.emit)
    lease = settings.replicas.replica_lease
    peer = RemoteTasks(router)
    return Tasks(
        table, group, max_ttl_ms=ttl_ms, emit=events.emit, peer=peer, url=router.me, lease=lease, heartbeat=lease / 3
    )


@contextlib.asynccontextmanager
async def open_service(
    settings: Settings, *, http: bool, discovery: Discovery | None = None, backend: Backend | None = None
) -> AsyncIterator[Service]:
    """Open the whole service; everything is closed (bounded) when the block exits.

    ``discovery`` replaces the discovery of downstream servers, ``backend`` the configured backend,
    unprobed (tests use both).

    Raises:
        ConfigError, BackendUnavailableError: the configuration or the host cannot serve.
    """
    # Built once, shared by the engine, the stores and the tools: a malformed tenant's egress stops the start here.
    layout = StateLayout.of(settings)
    egress = TenantEgress(settings)
    events = EventHub()
    engine = await _open_engine(settings, events, backend, layout=layout, egress=egress)  # its uids shared too
    js = js_status(settings)
    if js.problem is not None:
        logger.warning("TypeScript/JavaScript runs will fail: %s", js.advice())
    async with _open_stores(settings, layout, engine) as (metadata, secret, workspaces, mirror):
        audit = AuditLog.open(layout.audit_log)
        refusals = Tally(audit, "download_refused", REFUSALS_INTERVAL)
        events.subscribe(auditor(audit, refusals))
        try:
            runner_data = await anyio.to_thread.run_sync(
                import_runner_data,
                settings.workspaces.runner_data,
                settings.workspaces.runner_secret,
                layout.runner_import,
                workspaces,
            )
            busy = Busy(engine.live_sessions)
            leases = None
            if http and settings.replicas.replica_url is not None:
                leases = replica_leases(
                    settings.replicas, metadata.database, engine.end_session, busy, engine.live_sessions
                )
            storage = Storage(workspaces, metadata, events, busy, mirror=mirror, leases=leases, runner_data=runner_data)
            idle = None  # later writes of sessions
            if mirror is not None:
                holds = None if leases is None else leases.holds
                interval = settings.paths.write_back_interval
                idle = IdleWrites(
                    storage.write_back, engine.live_sessions, busy.in_flight, holds, interval, busy.unsaved
                )
            urls = UrlSigner(derive_key(secret, "download-url"), settings.http.base_url, settings.http.url_ttl)
            lifecycle = Lifecycle()
            parked = ParkedStates(layout, secret, None if mirror is None else StoredParked(mirror.objects))
            async with (
                _replication(settings, leases, secret, storage, idle) as router,  # exits last
                open_mediator(settings, discovery, events, layout=layout) as mediator,
                engine.running(parked),
                anyio.create_task_group() as group,
                anyio.create_task_group() as writes,  # never cancelled: its exit waits for the last writes
            ):
                metrics = _observers(settings, engine, lifecycle, metadata, events, writes)
                ttl_ms = min(MAX_TTL_MS, int(settings.workspaces.conversation_ttl * 1000))  # never past the files
                tasks = _tasks(settings, TaskTable(metadata.database), group, ttl_ms, events, router)
                service = Service(
                    settings=settings,
                    engine=engine,
                    mediator=mediator,
                    storage=storage,
                    urls=urls,
                    http=http,
                    egress=egress,
                    events=events,
                    lifecycle=lifecycle,
                    metrics=metrics,
                    busy=busy,
                    router=router,
                    secret=secret,
                    tasks=tasks,
                    parked=parked,
                    checkpoints=Checkpoints(
                        settings.workspaces,
                        layout,
                        engine.tenant_uids,
                        workspaces.gate,
                        None if mirror is None else StoredCheckpoints(mirror.objects),
                    ),
                )
                group.start_soon(tasks.keep)
                lifecycle.on_reload("servers", service.reload_servers)
                if idle is not None:
                    events.subscribe(idle.observe)
                    group.start_soon(idle.run)
                if leases is not None:
                    group.start_soon(leases.keep)
                    held = leases
                    # With the object store, idle sessions are parked there before their leases are given back.
                    parks = engine if mirror is not None else None
                    lifecycle.on_drain(
                        lambda: flushed(idle, _parked_then(parks, held.release_all(keep=busy.in_flight()))),
                        lambda: flushed(idle, _parked_then(parks, held.release_all())),
                    )
                group.start_soon(_sweep_periodically, service)
                group.start_soon(flush_periodically, refusals)
                # What is alive now (the SDK's and pydantic's models, the engine) lives as long as the
                # service: the cyclic GC stops walking it, whose full collections otherwise stall a
                # run now and then.
                gc.freeze()
                try:
                    yield service
                finally:
                    gc.unfreeze()
                    group.cancel_scope.cancel()
        finally:
            refusals.flush()
            audit.close()
