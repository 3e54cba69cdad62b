"""One loader, one typed settings object, built once and injected.

Precedence, highest first: command-line flags, environment (``MCP_SANDBOX_<NAME>``, then the
earlier systems' aliases), the TOML file (``--config`` or ``MCP_SANDBOX_CONFIG``), defaults.
Nothing here reads the environment at import time: callers pass it in.

- ``fields``: how a setting is declared (default, description, unit, alias, check);
- ``settings``: :class:`Settings`, made of the pieces of ``pieces``, ``conversations``, ``server_pieces``,
  ``replicas`` and ``migration`` (the earlier systems' settings and names), where every setting is
  declared once; ``defaults``: the host's defaults;
- ``values``: parsing what people write (sizes, durations, booleans, lists) into a field's type;
- ``file``: the TOML file, parsed once; ``tokens`` and ``tenants``: its ``[auth]`` and
  ``[tenants.<name>]`` tables;
- ``engine``: :class:`EngineSettings`, the pieces the engine is built from;
- ``sources``: the environment and its aliases, and the loader, :func:`load_config`;
- ``reference``: the settings table of the docs, rendered from the declarations.
"""

from mcp_sandbox.config.conversations import SessionSettings, WorkspaceSettings
from mcp_sandbox.config.defaults import (
    JS_RUNTIMES,
    OUTPUT_MODES,
    SANDBOX_USER,
    OutputMode,
    default_data_dir,
    default_gate_dir,
    default_js_runtime_dir,
    default_python_runtime,
    default_sandbox_ids,
    default_state_dir,
)
from mcp_sandbox.config.engine import EngineSettings
from mcp_sandbox.config.file import ConfigFile, parse_config_file, read_config_file
from mcp_sandbox.config.migration import MigrationSettings
from mcp_sandbox.config.pieces import (
    LimitSettings,
    PathSettings,
    PoolSettings,
    SandboxSettings,
)
from mcp_sandbox.config.replicas import ReplicaSettings
from mcp_sandbox.config.secrets import SecretSpec, SecretValue
from mcp_sandbox.config.server_pieces import (
    AdmissionSettings,
    AuthSettings,
    CodeModeSettings,
    EgressSettings,
    HttpSettings,
)
from mcp_sandbox.config.settings import PLACES, SETTINGS, Settings
from mcp_sandbox.config.sources import ENV_ALIASES, Config, load_config, load_settings
from mcp_sandbox.config.tenant import TENANT_DEFAULTS, Tenant
from mcp_sandbox.config.tenant_tables import with_tenant_caps
from mcp_sandbox.config.tokens import DEFAULT_TENANT, TenantToken, load_tokens
from mcp_sandbox.config.values import parse_bytes, parse_duration

__all__ = [
    "DEFAULT_TENANT",
    "ENV_ALIASES",
    "JS_RUNTIMES",
    "OUTPUT_MODES",
    "PLACES",
    "SANDBOX_USER",
    "SETTINGS",
    "TENANT_DEFAULTS",
    "AdmissionSettings",
    "AuthSettings",
    "CodeModeSettings",
    "Config",
    "ConfigFile",
    "EgressSettings",
    "EngineSettings",
    "HttpSettings",
    "LimitSettings",
    "MigrationSettings",
    "OutputMode",
    "PathSettings",
    "PoolSettings",
    "ReplicaSettings",
    "SandboxSettings",
    "SecretSpec",
    "SecretValue",
    "SessionSettings",
    "Settings",
    "Tenant",
    "TenantToken",
    "WorkspaceSettings",
    "default_data_dir",
    "default_gate_dir",
    "default_js_runtime_dir",
    "default_python_runtime",
    "default_sandbox_ids",
    "default_state_dir",
    "load_config",
    "load_settings",
    "load_tokens",
    "parse_bytes",
    "parse_config_file",
    "parse_duration",
    "read_config_file",
    "with_tenant_caps",
]
