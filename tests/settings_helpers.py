"""The settings' pieces a component takes, built from one ``Settings`` as the server's start-up does."""

from __future__ import annotations

from mcp_sandbox.config import LimitSettings, PathSettings, SandboxSettings, Settings
from mcp_sandbox.state import StateLayout
from mcp_sandbox.tenant_uids import TenantUids
from mcp_sandbox.workspace import WorkspaceStore


def bwrap_pieces(settings: Settings) -> tuple[SandboxSettings, PathSettings, LimitSettings, StateLayout]:
    """The arguments of ``BwrapBackend``."""
    return (
        settings.sandbox,
        settings.paths,
        settings.limits,
        StateLayout.of(settings.paths, settings.sandbox, settings.workspaces),
    )


def store_of(settings: Settings, secret: bytes) -> WorkspaceStore:
    """A ``WorkspaceStore`` of ``settings``' quotas, over its own tenants' uids of the state directory."""
    return WorkspaceStore(
        settings.workspaces,
        secret,
        TenantUids(settings.sandbox, StateLayout.of(settings.paths, settings.sandbox, settings.workspaces)),
    )
