"""The running service: engine, code mode's mediator, workspaces, metadata and URL signing, opened together.

:func:`open_service` owns them all for the server's lifetime (stdio or HTTP): it checks the
backend, opens the metadata database, loads (or creates) the server secret, sweeps retention
at start and then periodically, and closes sessions and downstream servers on the way out.
Small openers (:mod:`.openers`) open the parts first (the storage, the replication, the
observers: the event hub's metrics, audit log and run history), then :class:`Service` is built
once with all it owns; nothing is assigned to it later. With ``replica_url``, it holds the
replica's leases and forwarding (:mod:`mcp_sandbox.replicas`), given back on drain and at the end.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass

import anyio

from mcp_sandbox.bridge.discovery import Discovery, discover
from mcp_sandbox.bridge.mediator import Mediator, open_mediator
from mcp_sandbox.config import (
    AdmissionSettings,
    CodeModeSettings,
    HttpSettings,
    LimitSettings,
    MigrationSettings,
    OutputMode,
    PathSettings,
    PoolSettings,
    SandboxSettings,
    SessionSettings,
    Settings,
    WorkspaceSettings,
)
from mcp_sandbox.egress import TenantEgress
from mcp_sandbox.engine import Engine
from mcp_sandbox.engine.parking import ParkedStates
from mcp_sandbox.engine.startup import tenant_egress
from mcp_sandbox.events import EventHub
from mcp_sandbox.provision import js_status
from mcp_sandbox.replicas.forward import Router
from mcp_sandbox.replicas.mirror import Mirror
from mcp_sandbox.sandbox.backends.base import Backend
from mcp_sandbox.server.audit_trail import flush_periodically
from mcp_sandbox.server.busy import Busy
from mcp_sandbox.server.lifecycle import Lifecycle
from mcp_sandbox.server.metrics import Metrics
from mcp_sandbox.server.openers import (
    open_observers,
    open_replication,
    open_storage,
    prepared_engine,
    ready,
    server_tasks,
)
from mcp_sandbox.server.storage import Storage
from mcp_sandbox.server.tasks.runtime import Tasks
from mcp_sandbox.server.urls import UrlSigner
from mcp_sandbox.state import StateLayout
from mcp_sandbox.workspace import Metadata, WorkspaceStore, derive_key
from mcp_sandbox.workspace.checkpoints import Checkpoints
from mcp_sandbox.workspace.runner_data import RunnerData

__all__ = ["RETENTION_INTERVAL", "Service", "open_service"]

logger = logging.getLogger(__name__)

RETENTION_INTERVAL = 300.0  # the default of settings.retention_interval (a sweep also runs at start)


@dataclass(frozen=True)
class Service:
    """Everything a tool call or a file route needs, built once by :func:`open_service`. ``http``:
    download URLs exist."""

    # The pieces of the settings the tools and routes read (start-up alone holds them all).
    output_mode: OutputMode
    limits: LimitSettings
    paths: PathSettings
    sandbox: SandboxSettings
    pool: PoolSettings
    sessions: SessionSettings
    workspace_settings: WorkspaceSettings
    admission: AdmissionSettings
    code_mode: CodeModeSettings
    http_settings: HttpSettings
    migration: MigrationSettings
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
    # Tool calls run as MCP Tasks (server/tasks), kept in the metadata database.
    tasks: Tasks

    @property
    def secret(self) -> bytes:
        """The server secret (shared through the database when database_url is set): keys derive from it."""
        return self.storage.secret

    @property
    def parked(self) -> ParkedStates:
        """Parked interpreter states (idle sessions, checkpoints' variables), signed; with replicas, also stored."""
        return self.storage.parked

    @property
    def checkpoints(self) -> Checkpoints:
        """Checkpoints' files (workspace/checkpoints.py)."""
        return self.storage.checkpoints

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
        return ready(self.engine, self.lifecycle, self.pool.pool_min)


async def _sweep_periodically(storage: Storage, limits: WorkspaceSettings) -> None:
    while True:
        try:
            await storage.sweep(limits)
        except OSError as exc:
            logger.error("retention sweep failed: %s", exc)
        await anyio.sleep(limits.retention_interval)


@contextlib.asynccontextmanager
async def open_service(
    settings: Settings, *, http: bool, discovery: Discovery | None = None, backend: Backend | None = None
) -> AsyncIterator[Service]:
    """Open the whole service; everything is closed (bounded) when the block exits, in the reverse
    order: the background tasks, the sessions, the downstream servers, the replication (the last
    idle write-backs, then the leases), the observers (the last history rows, the audit log), the
    storage.

    ``discovery`` replaces the discovery of downstream servers, ``backend`` the configured backend,
    unprobed (tests use both).

    Raises:
        ConfigError, BackendUnavailableError: the configuration or the host cannot serve.
    """
    # Built once, shared by the engine, the stores and the tools: a malformed tenant's egress stops the start here.
    layout = StateLayout.of(settings.paths, settings.sandbox, settings.workspaces)
    egress = tenant_egress(settings)
    events = EventHub()
    source = settings.config_read or settings.config_file  # the downstream servers as the loader read them
    found = discovery if discovery is not None else await anyio.to_thread.run_sync(discover, settings.code_mode, source)
    engine = await prepared_engine(settings, events, backend, layout=layout, egress=egress)  # its uids shared too
    js = js_status(settings.paths)
    if js.problem is not None:
        logger.warning("TypeScript/JavaScript runs will fail: %s", js.advice())
    busy = Busy(engine.live_sessions)
    lifecycle = Lifecycle()
    replicated = http and settings.replicas.replica_url is not None
    async with (
        open_storage(settings, layout, engine, events, busy, replicated=replicated) as storage,
        open_observers(settings, layout, engine, lifecycle, storage, events) as observers,
        open_replication(settings, storage, engine, busy, lifecycle, events) as replication,
        open_mediator(settings.code_mode, found, events, layout, settings.tenant_count) as mediator,
        engine.running(storage.parked),
        anyio.create_task_group() as group,
    ):
        service = Service(
            output_mode=settings.output_mode,
            limits=settings.limits,
            paths=settings.paths,
            sandbox=settings.sandbox,
            pool=settings.pool,
            sessions=settings.sessions,
            workspace_settings=settings.workspaces,
            admission=settings.admission,
            code_mode=settings.code_mode,
            http_settings=settings.http,
            migration=settings.migration,
            engine=engine,
            mediator=mediator,
            storage=storage,
            urls=UrlSigner(derive_key(storage.secret, "download-url"), settings.http.base_url, settings.http.url_ttl),
            http=http,
            egress=egress,
            events=events,
            lifecycle=lifecycle,
            metrics=observers.metrics,
            busy=busy,
            router=replication.router,
            tasks=server_tasks(settings, storage, group, events, replication.router),
        )
        lifecycle.on_reload("servers", functools.partial(mediator.reload, settings.code_mode, settings.config_file))
        group.start_soon(service.tasks.keep)
        group.start_soon(replication.keep)
        group.start_soon(_sweep_periodically, storage, settings.workspaces)
        group.start_soon(flush_periodically, observers.refusals)
        # What is alive now (the SDK's and pydantic's models, the engine) lives as long as the
        # service: the cyclic GC stops walking it, whose full collections otherwise stall a
        # run now and then.
        gc.freeze()
        try:
            yield service
        finally:
            gc.unfreeze()
            group.cancel_scope.cancel()
