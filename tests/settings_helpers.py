"""The settings' pieces a component takes, built from one ``Settings`` as the server's start-up does."""

from __future__ import annotations

from mcp_sandbox.config import LimitSettings, PathSettings, SandboxSettings, Settings
from mcp_sandbox.state import StateLayout


def bwrap_pieces(settings: Settings) -> tuple[SandboxSettings, PathSettings, LimitSettings, StateLayout]:
    """The arguments of ``BwrapBackend``."""
    return settings.sandbox, settings.paths, settings.limits, StateLayout.of(settings)
