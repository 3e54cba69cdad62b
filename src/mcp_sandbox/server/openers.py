"""The parts of the running service, each opened by a small opener before :class:`.Service` is built.

:func:`open_storage` opens the conversations' storage (the metadata index, the server secret,
the workspaces, their object-store copy, the earlier runner's data, the parked states and the
checkpoints, with this replica's leases fencing what calls record); :func:`open_replication` the
replica's router and the idle write-backs; :func:`open_observers` the audit log, the metrics and
the run history on the event hub. Each is an async context manager that yields what it opened
and closes it, bounded, when its block exits, also when a later opener failed.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
from collections.abc import AsyncIterator, Awaitable
from typing import Any

import anyio
import anyio.to_thread
from anyio.abc import TaskGroup

from mcp_sandbox.audit import AuditLog, Tally
from mcp_sandbox.config import Settings
from mcp_sandbox.engine import Engine
from mcp_sandbox.engine.parking import ParkedStates
from mcp_sandbox.engine.startup import engine_for, open_engine
from mcp_sandbox.events import EventHub
from mcp_sandbox.replicas.checkpoints import StoredCheckpoints
from mcp_sandbox.replicas.forward import Router
from mcp_sandbox.replicas.idle_writes import IdleWrites, flushed
from mcp_sandbox.replicas.mirror_opening import open_mirror
from mcp_sandbox.replicas.parked import StoredParked
from mcp_sandbox.replicas.running import open_replica, replica_leases
from mcp_sandbox.replicas.shared_secret import load_shared_secret
from mcp_sandbox.sandbox.backends.base import Backend
from mcp_sandbox.server.audit_trail import REFUSALS_INTERVAL, auditor
from mcp_sandbox.server.busy import Busy
from mcp_sandbox.server.history import History
from mcp_sandbox.server.lifecycle import Lifecycle
from mcp_sandbox.server.metrics import Metrics, stored_per_tenant
from mcp_sandbox.server.storage import Storage
from mcp_sandbox.server.tasks.remote import RemoteTasks
from mcp_sandbox.server.tasks.runtime import MAX_TTL_MS, Tasks
from mcp_sandbox.server.tasks.table import TaskTable
from mcp_sandbox.state import StateLayout
from mcp_sandbox.workspace import Metadata, WorkspaceStore, load_secret
from mcp_sandbox.workspace.checkpoints import Checkpoints
from mcp_sandbox.workspace.runner_data import import_runner_data

__all__ = [
    "Observers",
    "Replication",
    "open_observers",
    "open_replication",
    "open_storage",
    "prepared_engine",
    "ready",
    "server_tasks",
]

logger = logging.getLogger(__name__)


async def prepared_engine(settings: Settings, events: EventHub, backend: Backend | None, **shared: Any) -> Engine:
    """The engine on ``backend`` (unprobed), else on the configured backend, probed."""
    if backend is not None:
        engine = engine_for(settings, backend, events, **shared)
        engine.prepare()
        return engine
    # In a worker thread: probing the backend runs processes, and the event loop may be serving.
    return await anyio.to_thread.run_sync(functools.partial(open_engine, settings, events, **shared))


@contextlib.asynccontextmanager
async def open_storage(
    settings: Settings, layout: StateLayout, engine: Engine, events: EventHub, busy: Busy, *, replicated: bool
) -> AsyncIterator[Storage]:
    """The conversations' storage; ``replicated``: with this replica's leases (replica_url over HTTP).
    At the end the metadata index is closed, then the object store's client."""
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
            workspaces = WorkspaceStore(settings.workspaces, secret, engine.tenant_uids, engine.gate)
            if swept := await anyio.to_thread.run_sync(workspaces.sweep_partials):
                logger.info("deleted %d partial uploads a crash left", swept)
            if settings.replicas.object_store_url is not None:
                mirror = await anyio.to_thread.run_sync(open_mirror, settings.replicas, workspaces)
            runner = settings.migration  # the earlier code runner's data, imported once
            runner_data = await anyio.to_thread.run_sync(
                import_runner_data, runner.runner_data, runner.runner_secret, layout.runner_import, workspaces
            )
        except BaseException:
            metadata.close()
            raise
        leases = None
        if replicated:
            leases = replica_leases(
                settings.replicas, metadata.database, engine.end_session, busy, engine.live_sessions
            )
        objects = None if mirror is None else mirror.objects
        try:
            yield Storage(
                workspaces,
                metadata,
                events,
                busy,
                secret=secret,
                mirror=mirror,
                leases=leases,
                runner_data=runner_data,
                parked=ParkedStates(layout, secret, None if objects is None else StoredParked(objects)),
                checkpoints=Checkpoints(
                    settings.workspaces,
                    layout,
                    engine.tenant_uids,
                    workspaces.gate,
                    None if objects is None else StoredCheckpoints(objects),
                ),
            )
        finally:
            metadata.close()
    finally:
        if mirror is not None:
            mirror.objects.close()


@dataclasses.dataclass(frozen=True)
class Replication:
    """A replica's router (None: one server) and the idle write-backs (None: no object store)."""

    router: Router | None
    idle: IdleWrites | None

    async def keep(self) -> None:
        """Renew the leases and write back the idle conversations, until cancelled."""
        async with anyio.create_task_group() as group:
            if self.idle is not None:
                group.start_soon(self.idle.run)
            if self.router is not None:
                group.start_soon(self.router.leases.keep)


@contextlib.asynccontextmanager
async def open_replication(
    settings: Settings, storage: Storage, engine: Engine, busy: Busy, lifecycle: Lifecycle, events: EventHub
) -> AsyncIterator[Replication]:
    """The replica's router and the idle write-backs (run :meth:`Replication.keep` meanwhile). On a
    drain and at the end, the last idle write-backs, then the leases given back (with the object
    store, once the idle sessions are parked there)."""
    leases = storage.leases
    idle = None  # later writes of sessions
    if storage.mirror is not None:
        holds = None if leases is None else leases.holds
        interval = settings.paths.write_back_interval
        idle = IdleWrites(storage.write_back, engine.live_sessions, busy.in_flight, holds, interval, busy.unsaved)
        events.subscribe(idle.observe)
    async with contextlib.AsyncExitStack() as stack:
        router = None
        if leases is not None:
            router = await stack.enter_async_context(
                open_replica(
                    settings.replicas, settings.http, settings.limits, leases, storage.secret, storage.restore_files
                )
            )
            held = leases
            parks = engine if storage.mirror is not None else None
            lifecycle.on_drain(
                lambda: flushed(idle, _parked_then(parks, held.release_all(keep=busy.in_flight()))),
                lambda: flushed(idle, _parked_then(parks, held.release_all())),
            )
        if idle is not None:  # after the sessions are closed, before the leases are given back
            stack.push_async_callback(idle.flush)
        yield Replication(router, idle)


async def _parked_then(engine: Engine | None, then: Awaitable[None]) -> None:
    """Park ``engine``'s idle sessions (none: no object store to park them for another replica), then
    ``then``: a replica's leases are given back with their states in the store, never before."""
    if engine is not None:
        await engine.park_sessions()
    await then


@dataclasses.dataclass(frozen=True)
class Observers:
    """The metrics, and the tally of downloads refused to strangers (flush it periodically)."""

    metrics: Metrics
    refusals: Tally


@contextlib.asynccontextmanager
async def open_observers(
    settings: Settings, layout: StateLayout, engine: Engine, lifecycle: Lifecycle, storage: Storage, events: EventHub
) -> AsyncIterator[Observers]:
    """The audit log, the metrics and the run history, subscribed to ``events``. At the end the last
    history rows are written, then the tally's line, then the audit log is closed."""
    audit = AuditLog.open(layout.audit_log)
    refusals = Tally(audit, "download_refused", REFUSALS_INTERVAL)
    try:
        events.subscribe(auditor(audit, refusals))
        pool_min = settings.pool.pool_min
        metadata = storage.metadata
        metrics = Metrics(functools.partial(_gauges, engine, lifecycle, pool_min), functools.partial(_stored, metadata))
        events.subscribe(metrics.observe)
        async with anyio.create_task_group() as writes:  # never cancelled: its exit waits for the last writes
            events.subscribe(History(metadata, writes).observe)
            yield Observers(metrics, refusals)
    finally:
        refusals.flush()
        audit.close()


def ready(engine: Engine, lifecycle: Lifecycle, pool_min: int) -> bool:
    """Whether runs can be served now: not draining, and the warm pool up where there is one."""
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
        "ready": float(ready(engine, lifecycle, pool_min)),
    }


def _stored(metadata: Metadata) -> dict[str, int]:
    """Bytes stored per tenant, as the metadata index last recorded them."""
    return stored_per_tenant((row.tenant, row.bytes) for row in metadata.conversations_by_last_use())


def server_tasks(
    settings: Settings, storage: Storage, group: TaskGroup, events: EventHub, router: Router | None
) -> Tasks:
    """The server's tasks, kept in the metadata database, never past the conversations' files; with
    replicas each names its replica, which any other asks about it (:mod:`.tasks.remote`), and a
    replica's death fails its tasks within ``replica_lease``."""
    table = TaskTable(storage.metadata.database)
    ttl_ms = min(MAX_TTL_MS, int(settings.workspaces.conversation_ttl * 1000))
    if router is None:
        return Tasks(table, group, max_ttl_ms=ttl_ms, emit=events.emit)
    lease = settings.replicas.replica_lease
    peer = RemoteTasks(router)
    return Tasks(
        table, group, max_ttl_ms=ttl_ms, emit=events.emit, peer=peer, url=router.me, lease=lease, heartbeat=lease / 3
    )
