"""The running service: engine, code mode's mediator, workspaces, metadata and URL signing, opened together.

:func:`open_service` owns them all for the server's lifetime (stdio or HTTP): it checks the
backend, opens the metadata database, loads (or creates) the server secret, sweeps retention
at start and then periodically, and closes sessions and downstream servers on the way out.
It also owns what watches the service: the event hub the engine, the bridge and the routes
emit to, the metrics, the audit log and the run history subscribed to it, and the lifecycle
(drain, reload). With ``replica_url``, it holds the replica's leases and forwarding
(:mod:`mcp_sandbox.replicas`), given back on drain and at the end.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import functools
import gc
import logging
import os
import time
from collections.abc import AsyncIterator, Collection, Iterator
from dataclasses import dataclass
from pathlib import Path

import anyio
import anyio.from_thread
import anyio.to_thread

from mcp_sandbox.audit import AuditLog, Tally
from mcp_sandbox.bridge.discovery import Discovery, discover
from mcp_sandbox.bridge.mediator import Mediator, open_mediator
from mcp_sandbox.config import Settings
from mcp_sandbox.egress import TenantEgress
from mcp_sandbox.engine import Engine
from mcp_sandbox.engine.startup import open_engine
from mcp_sandbox.errors import WorkspaceError
from mcp_sandbox.events import EventHub, FilesUnsaved
from mcp_sandbox.provision import js_status
from mcp_sandbox.replicas.forward import Router
from mcp_sandbox.replicas.imported import record_names
from mcp_sandbox.replicas.mirror import Changes, Mirror
from mcp_sandbox.replicas.opening import open_mirror
from mcp_sandbox.replicas.running import open_replica
from mcp_sandbox.sandbox.backends.base import Backend
from mcp_sandbox.server.audit_trail import REFUSALS_INTERVAL, auditor, flush_periodically
from mcp_sandbox.server.history import History
from mcp_sandbox.server.idle_writes import IdleWrites, flushed
from mcp_sandbox.server.lifecycle import Lifecycle
from mcp_sandbox.server.metrics import Metrics, stored_per_tenant
from mcp_sandbox.server.tasks.runtime import MAX_TTL_MS, Tasks
from mcp_sandbox.server.tasks.table import TaskTable
from mcp_sandbox.server.urls import UrlSigner
from mcp_sandbox.state import StateLayout
from mcp_sandbox.workspace import (
    FileEntry,
    Metadata,
    WorkspaceStore,
    derive_key,
    load_secret,
    sweep,
)
from mcp_sandbox.workspace.fencing import Fence
from mcp_sandbox.workspace.runner_data import RunnerData, import_runner_data
from mcp_sandbox.workspace.shared_secret import load_shared_secret

__all__ = ["RETENTION_INTERVAL", "Service", "open_service"]

logger = logging.getLogger(__name__)

RETENTION_INTERVAL = 300.0  # the default of settings.retention_interval (a sweep also runs at start)


@dataclass
class Service:
    """Everything a tool call or a file route needs. ``http``: download URLs exist."""

    settings: Settings
    engine: Engine
    mediator: Mediator
    workspaces: WorkspaceStore
    metadata: Metadata
    urls: UrlSigner
    http: bool
    # Each tenant's egress rules, checked once at start (a malformed pattern refuses to start).
    egress: TenantEgress
    events: EventHub = dataclasses.field(default_factory=EventHub)
    lifecycle: Lifecycle = dataclasses.field(default_factory=Lifecycle)
    metrics: Metrics | None = None
    # The earlier code runner's data, imported at start (its SANDBOX_ROOT and FILE_SECRET set).
    runner_data: RunnerData | None = None
    # With replica_url: which replica runs each conversation, and the forwarding to it.
    router: Router | None = None
    # The workspaces' copy in the object store (object_store_url), else None: local disk only.
    mirror: Mirror | None = None
    # The server secret (shared through the database when database_url is set): keys derive from it.
    secret: bytes = dataclasses.field(default=b"", repr=False)
    tasks: Tasks | None = None  # tool calls run as MCP Tasks (server/tasks)

    in_use: collections.Counter[str] = dataclasses.field(default_factory=collections.Counter)

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

    async def touch(self, key: str, tenant: str, conversation: str | None = None) -> Path:
        """Create the conversation's directory if needed and mark it used now (call it within
        :meth:`using`); ``conversation``, its id, adopts the earlier runner's files imported for it.

        Raises:
            WorkspaceError: either could not be done (a full disk): a directory this call made
                is removed again, so no conversation has a directory without its row.
        """
        existed = await anyio.to_thread.run_sync(self.workspaces.directory(key).is_dir)
        # First seen here: another server of the store may have written it (replicas restore per lease).
        if not existed and self.mirror is not None and self.router is None:
            restored = await anyio.to_thread.run_sync(
                self.workspaces.gate.run, key, self.mirror.restore_new, key, tenant
            )
            self._count_unsaved(key, restored)
        directory = await anyio.to_thread.run_sync(self.workspaces.ensure, key, tenant)
        try:
            await anyio.to_thread.run_sync(self.metadata.touch_conversation, key, tenant, time.time())
        except WorkspaceError:
            if not existed and self.in_use[key] <= 1:  # no other request of this conversation in flight
                with anyio.CancelScope(shield=True), contextlib.suppress(OSError):
                    await anyio.to_thread.run_sync(os.rmdir, directory)  # only while empty
            raise
        if conversation is not None and self.runner_data is not None:
            adopted = await anyio.to_thread.run_sync(self.runner_data.adopt, tenant, conversation, key)
            if adopted and self.mirror is not None:  # its old links answer through every replica
                digest = self.runner_data.digest(conversation)
                names = await anyio.to_thread.run_sync(self.runner_data.names_of, digest)
                with contextlib.suppress(WorkspaceError):  # the store's refusal is logged; they stay local
                    if names is not None:  # first: a replica finding the link finds what it may serve
                        await anyio.to_thread.run_sync(record_names, self.mirror.objects, digest, names)
                    await anyio.to_thread.run_sync(self.mirror.record_link, digest, key)
        return directory

    def fence(self, key: str) -> Fence | None:
        """The lease conversation ``key``'s writes are fenced by now (:mod:`.workspace.fencing`); None: one server."""
        return None if self.router is None else Fence(self.router.me, self.router.leases.epoch(key))

    async def refresh_files(self, key: str, fence: Fence | None = None) -> list[FileEntry]:
        """List the conversation's files (never following the sandbox's symlinks) and record them, fenced
        by ``fence`` (default: :meth:`fence`; LeaseLostError: the lease is lost, nothing was recorded).

        A listing the metadata database cannot record (a full disk) is still returned: the index
        is brought up to date by the next listing, and retention measures the disk anyway.
        """
        lease = fence or self.fence(key)
        return await anyio.to_thread.run_sync(self.metadata.record_listing, key, self.workspaces.list_files, lease)

    async def write_back(self, key: str, fence: Fence | None = None) -> tuple[str, ...]:
        """Copy conversation ``key``'s changed files to the object store (no-op without one), fenced by
        ``fence`` (default: :meth:`fence`); call it before answering a run or acknowledging an upload.
        Returns the files it could not store (counted): the rest are stored, and the index with them.

        Raises:
            WorkspaceError: the store refused or could not be reached; LeaseLostError: the lease is lost.
        """
        if self.mirror is None:
            return ()
        check = self.metadata.fence_check(key, lease := fence or self.fence(key))
        changes = await anyio.to_thread.run_sync(self.mirror.write_back, key, check, lease.epoch if lease else 0)
        self._count_unsaved(key, changes)
        return changes.unsaved

    def _count_unsaved(self, key: str, changes: Changes) -> None:
        if changes.unsaved:
            self.events.emit(FilesUnsaved(key, "write_back", len(changes.unsaved)))
        if changes.lost:
            self.events.emit(FilesUnsaved(key, "restore", len(changes.lost)))

    async def restore_files(self, key: str, epoch: int) -> None:
        """Make conversation ``key``'s local directory equal to the object store's copy (no-op without
        one): a replica taking over a conversation another one served calls it first, in lease ``epoch``.

        Raises:
            WorkspaceError: the store or the disk refused.
        """
        if self.mirror is not None:
            tenant = await anyio.to_thread.run_sync(self.metadata.tenant_of, key)
            restore = functools.partial(self.mirror.restore, key, tenant, epoch)
            restored = await anyio.to_thread.run_sync(self.workspaces.gate.run, key, restore)
            self._count_unsaved(key, restored)

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
        if not engine.backend.warm_pool or self.settings.pool.pool_min == 0:
            return True
        return engine.pool.up > 0

    def gauges(self) -> dict[str, float]:
        """What the metrics read at each scrape (called from a worker thread: plain reads only)."""
        engine = self.engine
        return {
            "runs_running": engine.admission.running,
            "queue_length": engine.admission.waiting,
            "warm_pool_size": engine.pools.warm_size,  # every host uid's together: no tenant's name in a label
            "warm_pool_idle": engine.pools.warm_idle,
            "prestarted_size": engine.pools.prestarted_size,
            "prestarted_idle": engine.pools.prestarted_ready,
            "sessions": len(engine.live_sessions()),
            "draining": float(self.lifecycle.draining),
            "ready": float(self.ready()),
        }

    def stored(self) -> dict[str, int]:
        """Bytes stored per tenant, as the metadata index last recorded them."""
        return stored_per_tenant((row.tenant, row.bytes) for row in self.metadata.conversations_by_last_use())

    async def reload_servers(self) -> list[str]:
        """Re-read the downstream servers' tool allow/deny lists (SIGHUP)."""
        fresh = await anyio.to_thread.run_sync(discover, self.settings)
        return self.mediator.reload_policies(fresh)

    async def sweep(self) -> None:
        """Apply the retention policy now; conversations in use here, or leased by any replica, are spared."""
        forget = None if self.mirror is None else self.mirror.forget
        try:
            leased = set() if self.router is None else await anyio.to_thread.run_sync(self.router.leases.live)
        except WorkspaceError as exc:
            logger.warning("retention skipped: the conversations other replicas use cannot be read: %s", exc)
            return
        report = await anyio.to_thread.run_sync(
            lambda: sweep(self.workspaces, self.metadata, self.settings, time.time(), _Busy(self, leased), forget)
        )
        if report.removed or report.failed or report.history_pruned:
            logger.info("retention: %s", report.summary())


class _Busy(Collection[str]):
    """The conversations in use, read live from the sweep's worker thread.

    Retention checks each conversation just before deleting it; the answer is computed on the
    event loop, which owns the sessions and the in-use counts.
    """

    def __init__(self, service: Service, leased: set[str]) -> None:
        self._service = service
        self._leased = leased

    def _snapshot(self) -> set[str]:
        return set(self._service.engine.live_sessions()) | set(self._service.in_use) | self._leased

    def _keys(self) -> set[str]:
        return anyio.from_thread.run_sync(self._snapshot)

    def __contains__(self, key: object) -> bool:
        return key in self._keys()

    def __iter__(self) -> Iterator[str]:
        return iter(self._keys())

    def __len__(self) -> int:
        return len(self._keys())


async def _sweep_periodically(service: Service) -> None:
    while True:
        try:
            await service.sweep()
        except OSError as exc:
            logger.error("retention sweep failed: %s", exc)
        await anyio.sleep(service.settings.workspaces.retention_interval)


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
    layout = StateLayout.of(settings)
    egress = TenantEgress(settings)
    # In a worker thread: probing the backend runs processes, and the event loop may be serving.
    events = EventHub()
    if backend is None:
        engine = await anyio.to_thread.run_sync(open_engine, settings, events)
    else:
        engine = Engine(settings, backend, events)
        engine.prepare()
    js = js_status(settings)
    if js.problem is not None:
        logger.warning("TypeScript/JavaScript runs will fail: %s", js.advice())
    # In a worker thread: a PostgreSQL database (database_url) is reached over the network.
    metadata = await anyio.to_thread.run_sync(Metadata.open, layout.metadata, settings.paths.database_url)
    logger.info("metadata index: %s", metadata.description)
    try:  # with database_url, servers share the secret in the database
        shared = settings.paths.database_url is not None
        secret = await anyio.to_thread.run_sync(
            lambda: load_shared_secret(metadata.database, layout.root) if shared else load_secret(layout.root)
        )
        workspaces = WorkspaceStore(settings, secret, engine.gate)  # one change lock per conversation, shared
        if swept := await anyio.to_thread.run_sync(workspaces.sweep_partials):
            logger.info("deleted %d partial uploads a crash left", swept)
        mirror = None
        if settings.paths.object_store_url is not None:
            mirror = await anyio.to_thread.run_sync(open_mirror, settings, workspaces)
    except BaseException:
        metadata.close()
        raise
    audit = AuditLog.open(layout.audit_log)
    refusals = Tally(audit, "download_refused", REFUSALS_INTERVAL)
    events.subscribe(auditor(audit, refusals))
    try:
        urls = UrlSigner(derive_key(secret, "download-url"), settings.http.base_url, settings.http.url_ttl)
        async with (
            contextlib.AsyncExitStack() as replica,  # exits last: leases are given back once sessions are closed
            open_mediator(settings, discovery, events) as mediator,
            engine.running(),
            anyio.create_task_group() as group,
            anyio.create_task_group() as writes,  # never cancelled: its exit waits for the last writes
        ):
            service = Service(settings, engine, mediator, workspaces, metadata, urls, http, egress, events)
            service.mirror, service.secret = mirror, secret
            service.runner_data = await anyio.to_thread.run_sync(
                import_runner_data,
                settings.workspaces.runner_data,
                settings.workspaces.runner_secret,
                layout.runner_import,
                workspaces,
            )
            service.metrics = Metrics(service.gauges, service.stored)
            events.subscribe(service.metrics.observe)
            events.subscribe(History(metadata, writes).observe)
            service.lifecycle.on_reload("servers", service.reload_servers)
            idle = None if mirror is None else IdleWrites.started(service, group)  # later writes of sessions
            if http and settings.http.replica_url is not None:
                service.router = await replica.enter_async_context(
                    open_replica(
                        settings,
                        metadata.database,
                        secret,
                        engine.end_session,
                        lambda: engine.live_sessions() | set(service.in_use) | (idle.pending if idle else set()),
                        service.restore_files,
                    )
                )
                group.start_soon(service.router.leases.keep)
                leases = service.router.leases
                service.lifecycle.on_drain(
                    lambda: flushed(idle, leases.release_all(keep=set(service.in_use))),
                    lambda: flushed(idle, leases.release_all()),
                )
            if idle is not None:  # after the sessions are closed, before the leases are given back
                replica.push_async_callback(idle.flush)
            ttl_ms = min(MAX_TTL_MS, int(settings.workspaces.conversation_ttl * 1000))  # never past the files
            service.tasks = Tasks(TaskTable(metadata.database), group, max_ttl_ms=ttl_ms, emit=events.emit)
            group.start_soon(service.tasks.keep)
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
        metadata.close()
        if mirror is not None:
            mirror.objects.close()
