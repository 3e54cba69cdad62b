"""The pieces of the settings the engine is built from, and nothing of the server around it.

The engine opens sandboxes (``limits``, ``paths``, ``sandbox``), keeps pools and sessions
(``pool``, ``sessions``, ``workspaces``), admits runs (``admission``), caps what a run sends the
host (``code_mode``) and proxies its egress (``egress``); the HTTP service, the replicas and the
logging it never reads stay out. Start-up builds it once with :meth:`EngineSettings.of`; each of the
engine's parts is then given the one or two pieces it uses.
"""

from __future__ import annotations

from dataclasses import dataclass

from mcp_sandbox.config.conversations import SessionSettings, WorkspaceSettings
from mcp_sandbox.config.pieces import LimitSettings, PathSettings, PoolSettings, SandboxSettings
from mcp_sandbox.config.server_pieces import AdmissionSettings, CodeModeSettings, EgressSettings
from mcp_sandbox.config.settings import Settings

__all__ = ["EngineSettings"]


@dataclass(frozen=True, slots=True)
class EngineSettings:
    """The engine's pieces of :class:`~mcp_sandbox.config.settings.Settings`, each already checked."""

    limits: LimitSettings
    paths: PathSettings
    sandbox: SandboxSettings
    pool: PoolSettings
    sessions: SessionSettings
    workspaces: WorkspaceSettings
    admission: AdmissionSettings
    code_mode: CodeModeSettings
    egress: EgressSettings

    @classmethod
    def of(cls, settings: Settings) -> EngineSettings:
        """The engine's pieces of ``settings``."""
        return cls(
            limits=settings.limits,
            paths=settings.paths,
            sandbox=settings.sandbox,
            pool=settings.pool,
            sessions=settings.sessions,
            workspaces=settings.workspaces,
            admission=settings.admission,
            code_mode=settings.code_mode,
            egress=settings.egress,
        )
