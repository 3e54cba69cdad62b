"""Opening an engine: pick the backend, prove it enforces the policy, or refuse loudly.

The one place of the engine that takes the whole ``Settings``: it hands each part its pieces
(:func:`backend_for`, :func:`engine_for`, :func:`tenant_egress`), for the server's start and for
the commands, benches and tests that build an engine of their own.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from mcp_sandbox.config import EngineSettings, Settings
from mcp_sandbox.egress import Resolver, TenantEgress, system_resolver
from mcp_sandbox.engine.engine import Engine
from mcp_sandbox.errors import BackendUnavailableError, ConfigError
from mcp_sandbox.events import EventHub
from mcp_sandbox.provision.status import python_status
from mcp_sandbox.runners import runner_dir
from mcp_sandbox.sandbox.access import unreachable_ancestor
from mcp_sandbox.sandbox.backends import Backend, get_backend
from mcp_sandbox.state import StateLayout
from mcp_sandbox.tenant_uids import TenantUids, check_tenant_uids
from mcp_sandbox.workspace.changes import ChangeGate

__all__ = ["backend_for", "engine_for", "open_engine", "tenant_egress"]

logger = logging.getLogger(__name__)


def backend_for(settings: Settings, name: str | None = None, layout: StateLayout | None = None) -> Backend:
    """The backend ``name`` (default: the configured one) made from the settings' pieces it takes.

    Raises:
        ConfigError: no backend has that name.
    """
    return get_backend(
        settings.sandbox.backend if name is None else name,
        sandbox=settings.sandbox,
        paths=settings.paths,
        limits=settings.limits,
        layout=StateLayout.of(settings.paths, settings.sandbox, settings.workspaces) if layout is None else layout,
    )


def tenant_egress(settings: Settings) -> TenantEgress:
    """The tenants' egress rules of ``settings``, the server's own address refused.

    Raises:
        ConfigError: the egress settings of a tenant are malformed.
    """
    own = (settings.http.host, settings.http.port)
    return TenantEgress(settings.egress, own, settings.config_file)


def engine_for(
    settings: Settings,
    backend: Backend,
    events: EventHub | None = None,
    *,
    layout: StateLayout | None = None,
    uids: TenantUids | None = None,
    egress: TenantEgress | None = None,
    egress_resolver: Resolver = system_resolver,
    gate: ChangeGate | None = None,
) -> Engine:
    """An :class:`Engine` on ``backend``, given its pieces of ``settings`` and the shared objects
    (each built from ``settings`` when not given), not yet probed nor prepared (:func:`open_engine` is).

    Raises:
        ConfigError: ``egress`` is not given and the egress settings of a tenant are malformed.
    """
    return Engine(
        EngineSettings.of(settings),
        backend,
        events,
        layout=StateLayout.of(settings.paths, settings.sandbox, settings.workspaces) if layout is None else layout,
        egress=tenant_egress(settings) if egress is None else egress,
        uids=uids,
        egress_resolver=egress_resolver,
        gate=gate,
    )


def open_engine(
    settings: Settings,
    events: EventHub | None = None,
    *,
    layout: StateLayout | None = None,
    uids: TenantUids | None = None,
    egress: TenantEgress | None = None,
) -> Engine:
    """Build the engine on the configured backend after probing it; it emits to ``events``.

    ``layout``, ``uids``, ``egress``: the server's shared objects, handed to :class:`Engine`.

    Raises:
        ConfigError: the backend name or the Python runtime is wrong, or ``tenant_uid_range``
            could give a tenant someone else's uid (see :func:`~mcp_sandbox.tenant_uids.check_tenant_uids`).
        BackendUnavailableError: the backend does not work here, or cannot enforce part of the
            policy and ``accept_weaker_isolation`` is off.
    """
    check_tenant_uids(settings.sandbox, settings.tenant_count)
    runtime = python_status(settings.paths, settings.sandbox)
    if runtime.missing:
        raise ConfigError(f"python_runtime: {runtime.advice()} (in a checkout, `make runtime` builds .runtime)")
    if runtime.problem is not None:
        logger.warning("%s", runtime.advice())
    backend = backend_for(settings, layout=layout)
    probe = backend.probe()
    if not probe.available:
        raise BackendUnavailableError(f"backend {probe.name} is unavailable here: {probe.reason}")
    missing = probe.missing()
    if missing:
        listed = probe.missing_summary()
        if not settings.sandbox.accept_weaker_isolation:
            raise BackendUnavailableError(
                f"backend {probe.name} cannot enforce: {listed}. Fix the host (see `mcp-sandbox doctor`) or "
                "start with --accept-weaker-isolation / MCP_SANDBOX_ACCEPT_WEAKER_ISOLATION=1"
            )
        logger.warning("running with weaker isolation, as configured: %s", listed)
    engine = engine_for(settings, backend, events, layout=layout, uids=uids, egress=egress)
    engine.prepare()
    swept = engine.sweep()
    if swept:
        logger.info("removed %d scratch workspaces left by servers that died mid-run", swept)
    _check_reachable(settings)
    return engine


def _check_reachable(settings: Settings) -> None:
    """Every path a sandbox binds must be reachable by its host uid (root drops to it)."""
    if os.geteuid() != 0:
        return
    paths: dict[str, Path] = {
        "python_runtime": settings.paths.python_interpreter,
        "the in-sandbox runner": runner_dir("python") / "boot.py",
        "state_dir": settings.paths.state_dir,
    }
    # A tenant's own uid (tenant_uids.py) reaches what any uid of the range does.
    uids = [settings.sandbox.sandbox_uid, *settings.sandbox.tenant_uids[:1]]
    for what, path in paths.items():
        for uid in uids:
            blocked = unreachable_ancestor(path, uid, settings.sandbox.sandbox_gid, readable=what != "state_dir")
            if blocked is not None:
                raise ConfigError(
                    f"{what}: {path} is not reachable by the sandbox uid {uid} "
                    f"({blocked} is closed to it); move it, or open that directory with chmod o+x"
                )
