"""Where settings come from, and which wins: flags, then environment, then the TOML file.

The environment is ``MCP_SANDBOX_<NAME>``, then the earlier systems' names as aliases (the bridge's
``MCP_BRIDGE_*``; the code runner's ``MCP_API_TOKEN``, ``PUBLIC_BASE_URL``, ``MCP_HTTP_ADDR``);
the TOML file is ``--config`` or ``MCP_SANDBOX_CONFIG``. Nothing here reads the environment at
import time: callers pass it in (or :func:`load_settings` reads it when called).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from mcp_sandbox.config.settings import (
    Settings,
    default_data_dir,
    default_gate_dir,
    default_js_runtime_dir,
    default_python_runtime,
    default_state_dir,
)
from mcp_sandbox.config.values import FIELDS, coerce
from mcp_sandbox.errors import ConfigError

__all__ = ["ENV_ALIASES", "load_settings"]

# The earlier systems' variables, honoured when the MCP_SANDBOX_ name is not set.
ENV_ALIASES: Mapping[str, str] = {
    "MCP_BRIDGE_TIMEOUT": "timeout",
    "MCP_BRIDGE_MAX_TIMEOUT": "max_timeout",
    "MCP_BRIDGE_MEMORY": "memory",
    "MCP_BRIDGE_PIDS": "pids",
    "MCP_BRIDGE_CPUS": "cpus",
    "MCP_BRIDGE_RUNTIME": "container_runtime",
    "MCP_BRIDGE_IMAGE": "image",
    "MCP_BRIDGE_OUTPUT_MODE": "output_mode",
    "MCP_BRIDGE_STATE_DIR": "state_dir",
    "MCP_SERVERS_CONFIG": "servers_config",
    "MCP_BRIDGE_LOG_LEVEL": "log_level",
    # The earlier code runner's.
    "MCP_API_TOKEN": "token",
    "PUBLIC_BASE_URL": "public_url",
}

# Variables that give host and port in one ``host:port`` (Go's form: ``:8080`` is every address).
ADDRESS_ALIASES: tuple[str, ...] = ("MCP_HTTP_ADDR",)

# TOML tables owned by later layers (auth, code mode); accepted here, read there.
_RESERVED_TABLES = frozenset({"auth", "servers", "tenants"})


def _from_toml(path: Path) -> dict[str, Any]:
    import tomllib  # only when there is a file: most starts have none

    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigError(f"config file {path}: {exc.strerror}") from exc
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {path}: {exc}") from exc
    values: dict[str, Any] = {}
    for key, value in data.items():
        if key in _RESERVED_TABLES:
            continue
        if key not in FIELDS:
            raise ConfigError(f"config file {path}: unknown setting {key!r}")
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


def load_settings(
    flags: Mapping[str, Any] | None = None,
    env: Mapping[str, str] | None = None,
    config_file: Path | None = None,
) -> Settings:
    """Build the settings from flags, environment and TOML file.

    Args:
        flags: values given on the command line, by field name; ``None`` values are ignored.
        env: the environment to read (``os.environ`` when omitted).
        config_file: the TOML file; else ``MCP_SANDBOX_CONFIG`` from ``env``, else none.

    Raises:
        ConfigError: a value is malformed, unknown or out of range.
    """
    env = os.environ if env is None else env
    if config_file is None and env.get("MCP_SANDBOX_CONFIG"):
        config_file = Path(env["MCP_SANDBOX_CONFIG"]).expanduser()
    values: dict[str, Any] = {}
    if config_file is not None:
        values.update(_from_toml(config_file))
    values.update(_from_env(env))
    for name, raw in (flags or {}).items():
        if raw is None:
            continue
        if name not in FIELDS:
            raise ConfigError(f"unknown setting {name!r}")
        values[name] = coerce(name, raw)
    if "state_dir" not in values:
        values["state_dir"] = default_state_dir(env)
    # The runtimes default to places under data_dir; a checkout's .runtime wins unless data_dir is configured.
    checkout = "data_dir" not in values
    values.setdefault("data_dir", default_data_dir(env))
    values.setdefault("python_runtime", default_python_runtime(values["data_dir"], checkout=checkout))
    values.setdefault("js_runtime_dir", default_js_runtime_dir(values["data_dir"], checkout=checkout))
    values.setdefault("gate_dir", default_gate_dir(values["data_dir"], checkout=checkout))
    if config_file is not None:
        values["config_file"] = config_file
    try:
        return Settings(**values)
    except TypeError as exc:  # pragma: no cover - guarded by the FIELDS checks above
        raise ConfigError(str(exc)) from exc
