"""The settings object: small frozen pieces, and one table from each flat key to its piece.

Each setting is declared once (:func:`~.fields.setting`, in :mod:`.pieces`, :mod:`.server_pieces`, ...)
with its default, description, unit, alias and check; each piece checks its own values, and a
component can take only the piece it needs (``settings.limits``, ``settings.http``, ...). People
write the flat keys (``timeout``, ``MCP_SANDBOX_TIMEOUT``): :data:`SETTINGS` and
:data:`PLACES` map each to its piece, and :meth:`Settings.of` / :meth:`Settings.replace` take them.
"""

# ruff: noqa: RUF009 - each default is a dataclasses.field made by setting(), which declares the field.

from __future__ import annotations

import dataclasses
from dataclasses import Field, dataclass
from pathlib import Path
from typing import Any

from mcp_sandbox.config.conversations import SessionSettings, WorkspaceSettings
from mcp_sandbox.config.defaults import OUTPUT_MODES, OutputMode
from mcp_sandbox.config.fields import check_fields, internal, one_of, otlp_endpoint, piece, setting, setting_fields
from mcp_sandbox.config.file import ConfigFile
from mcp_sandbox.config.migration import MigrationSettings
from mcp_sandbox.config.pieces import (
    LimitSettings,
    PathSettings,
    PoolSettings,
    SandboxSettings,
)
from mcp_sandbox.config.replicas import ReplicaSettings
from mcp_sandbox.config.server_pieces import (
    AdmissionSettings,
    AuthSettings,
    CodeModeSettings,
    EgressSettings,
    HttpSettings,
)

__all__ = ["PLACES", "SETTINGS", "Settings"]


@dataclass(frozen=True, slots=True)
class Settings:
    """Every setting of mcp-sandbox, in pieces. Build with :func:`~mcp_sandbox.config.load_settings`."""

    output_mode: OutputMode = setting(
        "compact",
        "How results are rendered as text: `compact`, `json`, `toon` or `runner` (the earlier code runner's JSON;"
        " the default when only its variables configure the server).",
        check=one_of(OUTPUT_MODES),
        alias="MCP_BRIDGE_OUTPUT_MODE",
    )
    log_level: str = setting("WARNING", "Logs go to stderr (`MCP_BRIDGE_LOG_LEVEL` too).", alias="MCP_BRIDGE_LOG_LEVEL")

    otel_endpoint: str | None = setting(
        None,
        "The OTLP collector traces go to (`http://HOST:4317` for grpc); unset: no tracing, at no cost."
        " Needs the `otel` extra.",
        check=otlp_endpoint,
        alias="OTEL_EXPORTER_OTLP_ENDPOINT",
    )
    otel_protocol: str = setting(
        "grpc",
        "How traces reach the collector: `grpc` or `http/protobuf`.",
        check=one_of(("grpc", "http/protobuf")),
        alias="OTEL_EXPORTER_OTLP_PROTOCOL",
    )

    limits: LimitSettings = piece(LimitSettings)
    paths: PathSettings = piece(PathSettings)
    sandbox: SandboxSettings = piece(SandboxSettings)
    pool: PoolSettings = piece(PoolSettings)
    sessions: SessionSettings = piece(SessionSettings)
    workspaces: WorkspaceSettings = piece(WorkspaceSettings)
    admission: AdmissionSettings = piece(AdmissionSettings)
    code_mode: CodeModeSettings = piece(CodeModeSettings)
    http: HttpSettings = piece(HttpSettings)
    auth: AuthSettings = piece(AuthSettings)
    replicas: ReplicaSettings = piece(ReplicaSettings)
    egress: EgressSettings = piece(EgressSettings)
    migration: MigrationSettings = piece(MigrationSettings)

    # Not settings anyone gives: the TOML file the settings came from (and as the loader parsed it,
    # so that no part reads it again; SIGHUP's reload does), and how many tenants the server serves
    # (over HTTP, as many as the tokens name; finished with the per-tenant caps).
    config_file: Path | None = internal(None)
    config_read: ConfigFile | None = dataclasses.field(default=None, metadata={"internal": True}, repr=False)
    tenant_count: int = internal(1)

    def __post_init__(self) -> None:
        check_fields(self)

    @classmethod
    def of(cls, **values: Any) -> Settings:
        """Settings from flat keys (``timeout=5``), each given to its piece; the others are defaults.

        Raises:
            ConfigError: a value is out of range. TypeError: a key is no setting.
        """
        top, pieces = _grouped(values)
        return cls(**top, **{name: _PIECES[name](**given) for name, given in pieces.items()})

    def value(self, key: str) -> Any:
        """The value of the flat key ``key`` (``settings.value("timeout")``), wherever its piece is.

        Raises:
            KeyError: ``key`` is no setting.
        """
        place = PLACES[key]
        return getattr(self if place is None else getattr(self, place), key)

    def replace(self, **values: Any) -> Settings:
        """These settings with the flat keys given changed (``settings.replace(pool_size=0)``).

        Raises:
            ConfigError: a value is out of range. TypeError: a key is no setting.
        """
        top, pieces = _grouped(values)
        changed = {name: dataclasses.replace(getattr(self, name), **given) for name, given in pieces.items()}
        return dataclasses.replace(self, **top, **changed)


_PIECES: dict[str, type] = {f.name: f.default_factory for f in dataclasses.fields(Settings) if f.metadata.get("piece")}  # type: ignore[misc]

# Where each flat key lives: the name of its piece, or None for a field of Settings itself.
PLACES: dict[str, str | None] = {f.name: None for f in dataclasses.fields(Settings) if not f.metadata.get("piece")}
PLACES |= {f.name: name for name, kind in _PIECES.items() for f in dataclasses.fields(kind)}

# The settings of a piece cut out of another stay listed where they were (after the key named), so
# the docs' table reads as before: the tokens among the HTTP service's settings, the earlier
# systems' beside the sessions' and the workspaces'.
_LISTED_AFTER = {
    "token": "allowed_origins",
    "token_file": "token",
    "metrics_token": "token_file",
    "stdio_conversation": "session_cpu_seconds",
    "runner_data": "history_max_runs",
    "runner_secret": "runner_data",
}


def _listed() -> dict[str, Field[Any]]:
    """The pieces' settings in their order, each of :data:`_LISTED_AFTER` put back after the key it names."""
    pieces = {key: f for kind in _PIECES.values() for key, f in setting_fields(kind).items()}
    moved = {key: pieces.pop(key) for key in _LISTED_AFTER}
    following = {after: key for key, after in _LISTED_AFTER.items()}
    listed: dict[str, Field[Any]] = {}
    for key, declaration in pieces.items():
        listed[key], last = declaration, key
        while last in following:
            last = following[last]
            listed[last] = moved[last]
    return listed


# Every setting by flat key, in the order of the pieces: the one table sources, checks and docs read.
SETTINGS: dict[str, Field[Any]] = {**setting_fields(Settings), **_listed()}


def _grouped(values: dict[str, Any]) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
    top: dict[str, Any] = {}
    pieces: dict[str, dict[str, Any]] = {}
    for key, value in values.items():
        if key not in PLACES:
            raise TypeError(f"{key!r} is not a setting")
        place = PLACES[key]
        if place is None:
            top[key] = value
        else:
            pieces.setdefault(place, {})[key] = value
    return top, pieces
