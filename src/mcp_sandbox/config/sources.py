"""The loader: flags, environment and the TOML file, read once into a :class:`Config`.

Which wins: flags, then environment, then the TOML file, then defaults.

The environment is ``MCP_SANDBOX_<NAME>``, then the earlier systems' names as aliases (the bridge's
``MCP_BRIDGE_*``; the code runner's ``MCP_API_TOKEN``, ``PUBLIC_BASE_URL``, ``MCP_HTTP_ADDR``);
the TOML file is ``--config`` or ``MCP_SANDBOX_CONFIG``. Nothing here reads the environment at
import time: callers pass it in (or the loader reads it when called). The file's tables are
finished here too: ``[tenants.<name>]`` into the settings' tenants, ``[[secrets]]`` (and
``MCP_SANDBOX_SECRET_<NAME>``) into its secrets, ``[auth]`` into tokens.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mcp_sandbox.config.defaults import (
    default_data_dir,
    default_gate_dir,
    default_js_runtime_dir,
    default_python_runtime,
    default_state_dir,
)
from mcp_sandbox.config.file import ConfigFile, read_config_file
from mcp_sandbox.config.migration import ADDRESS_ALIASES, RUNNER_ENV
from mcp_sandbox.config.secrets import read_secrets
from mcp_sandbox.config.server_pieces import check_internal_listener
from mcp_sandbox.config.settings import SETTINGS, Settings
from mcp_sandbox.config.tenant import Tenant
from mcp_sandbox.config.tenant_tables import read_tenants, with_tenant_caps
from mcp_sandbox.config.tokens import TenantToken, read_tokens
from mcp_sandbox.config.values import FIELDS, coerce
from mcp_sandbox.errors import ConfigError

__all__ = ["ENV_ALIASES", "Config", "load_config", "load_settings"]

# The earlier systems' variables (each declared with its setting), honoured when the MCP_SANDBOX_
# name is not set.
ENV_ALIASES: Mapping[str, str] = {
    declaration.metadata["alias"]: name for name, declaration in SETTINGS.items() if declaration.metadata["alias"]
}


def _from_toml(file: ConfigFile) -> dict[str, Any]:
    values: dict[str, Any] = {}
    for key, value in file.settings.items():
        if key not in FIELDS:
            raise ConfigError(f"config file {file.path}: unknown setting {key!r}")
        values[key] = coerce(key, value)
    return values


def _split_address(value: str, where: str) -> tuple[str, int]:
    """``host:port``, ``[v6]:port`` or ``:port`` (every address) as ``(host, port)``.

    Raises:
        ConfigError: no port, or a port that is not a number.
    """
    host, colon, port = value.strip().rpartition(":")
    if not colon or not port.isdigit():
        raise ConfigError(f"{where}: {value!r} is not host:port (e.g. 127.0.0.1:8080, or :8080 for every address)")
    host = host.strip("[]") or "0.0.0.0"
    return host, int(port)


def _from_env(env: Mapping[str, str]) -> dict[str, Any]:
    values: dict[str, Any] = {}
    for alias in ADDRESS_ALIASES:
        if env.get(alias):
            values["host"], values["port"] = _split_address(env[alias], alias)
    for alias, name in ENV_ALIASES.items():
        if alias in env:
            values[name] = coerce(name, env[alias])
    for name in FIELDS:
        key = f"MCP_SANDBOX_{name.upper()}"
        if key in env:
            values[name] = coerce(name, env[key])
    return values


@dataclass(frozen=True, slots=True)
class Config:
    """What the loader read: the settings (with each tenant's egress), the tokens and the
    ``[servers]`` table of the TOML file (None without one; the bridge checks its entries)."""

    settings: Settings
    tokens: tuple[TenantToken, ...] = ()
    servers: object = None

    @property
    def tenants(self) -> tuple[Tenant, ...]:
        """The ``[tenants.<name>]`` tables, finished over the global egress settings."""
        return self.settings.egress.tenants

    def serving(self, transport: str) -> Settings:
        """The settings of a server on ``transport``, its per-tenant caps finished: over HTTP, as
        many tenants as the tokens name; over stdio, one.

        Raises:
            ConfigError: ``replica_url`` is set for a transport other than HTTP, or without ``database_url``;
                the internal listener's settings do not fit (:func:`~.serving.check_internal_listener`).
        """
        check_internal_listener(self.settings.http, self.settings.replicas.replica_url)
        if self.settings.replicas.replica_url is not None:
            if transport != "http":
                raise ConfigError(f"replica_url: replicas serve over HTTP, not {transport}: unset replica_url")
            if self.settings.replicas.database_url is None:
                raise ConfigError(
                    "replica_url: replicas share their leases through the database: set database_url too "
                    "(a postgresql:// URL), or unset replica_url"
                )
        tenants = len({token.tenant for token in self.tokens}) if transport == "http" else 1
        return with_tenant_caps(self.settings, tenants)


def _settings(flags: Mapping[str, Any] | None, env: Mapping[str, str], file: ConfigFile | None) -> Settings:
    values: dict[str, Any] = {}
    if file is not None:
        values.update(_from_toml(file))
    values.update(_from_env(env))
    for name, raw in (flags or {}).items():
        if raw is None:
            continue
        if name not in FIELDS:
            raise ConfigError(f"unknown setting {name!r}")
        values[name] = coerce(name, raw)
    if "output_mode" not in values and any(env.get(name) for name in RUNNER_ENV):
        values["output_mode"] = "runner"
    if "state_dir" not in values:
        values["state_dir"] = default_state_dir(env)
    # The runtimes default to places under data_dir; a checkout's .runtime wins unless data_dir is configured.
    checkout = "data_dir" not in values
    values.setdefault("data_dir", default_data_dir(env))
    values.setdefault("python_runtime", default_python_runtime(values["data_dir"], checkout=checkout))
    values.setdefault("js_runtime_dir", default_js_runtime_dir(values["data_dir"], checkout=checkout))
    values.setdefault("gate_dir", default_gate_dir(values["data_dir"], checkout=checkout))
    if file is None:
        return Settings.of(**values).replace(secrets=read_secrets(None, env, "environment"))
    settings = Settings.of(**values, config_file=file.path, config_read=file)
    secrets = read_secrets(file.secrets, env, f"config file {file.path}")
    return settings.replace(tenants=read_tenants(file.tenant_tables, settings), secrets=secrets)


def _file(env: Mapping[str, str], config_file: Path | None) -> ConfigFile | None:
    if config_file is None and env.get("MCP_SANDBOX_CONFIG"):
        config_file = Path(env["MCP_SANDBOX_CONFIG"]).expanduser()
    return None if config_file is None else read_config_file(config_file)


def load_config(
    flags: Mapping[str, Any] | None = None,
    env: Mapping[str, str] | None = None,
    config_file: Path | None = None,
) -> Config:
    """Read flags, environment and TOML file once into settings, tokens, tenants and servers.

    Args:
        flags: values given on the command line, by field name; ``None`` values are ignored.
        env: the environment to read (``os.environ`` when omitted).
        config_file: the TOML file; else ``MCP_SANDBOX_CONFIG`` from ``env``, else none.

    Raises:
        ConfigError: a value, table or token is malformed, unknown or out of range.
    """
    env = os.environ if env is None else env
    file = _file(env, config_file)
    settings = _settings(flags, env, file)
    # A refused token is named as its user gave it.
    given = "--token" if (flags or {}).get("token") is not None else _token_variable(env)
    if file is None:
        return Config(settings, read_tokens(settings.auth, [], given))
    return Config(settings, read_tokens(settings.auth, file.auth_tokens, given), file.servers)


def _token_variable(env: Mapping[str, str]) -> str:
    """The variable that gave ``token``: ``MCP_SANDBOX_TOKEN``, else the runner's ``MCP_API_TOKEN``."""
    return "MCP_API_TOKEN" if "MCP_SANDBOX_TOKEN" not in env and "MCP_API_TOKEN" in env else "MCP_SANDBOX_TOKEN"


def load_settings(
    flags: Mapping[str, Any] | None = None,
    env: Mapping[str, str] | None = None,
    config_file: Path | None = None,
) -> Settings:
    """The settings alone of :func:`load_config` (the file's ``[auth]`` and ``[servers]`` not read).

    Raises:
        ConfigError: a value or ``[tenants.<name>]`` table is malformed, unknown or out of range.
    """
    env = os.environ if env is None else env
    return _settings(flags, env, _file(env, config_file))
