"""The TOML file, parsed once: its settings, ``[auth]``, ``[tenants.<name>]`` and ``[servers]``.

The settings are the file's top-level keys; the tables are read by :mod:`.tokens`,
:mod:`.tenant_tables` and the bridge's discovery (which checks each server entry). Every malformed
file or table is a :class:`~mcp_sandbox.errors.ConfigError` that names the file.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mcp_sandbox.errors import ConfigError

__all__ = ["ConfigFile", "parse_config_file", "read_config_file"]

# The tables that are not settings: each read by the part of the server it configures.
TABLES = frozenset({"auth", "secrets", "servers", "tenants"})


@dataclass(frozen=True, slots=True)
class ConfigFile:
    """A parsed TOML file: ``path`` and its ``data`` as :mod:`tomllib` gives it."""

    path: Path
    data: Mapping[str, Any]

    @property
    def settings(self) -> dict[str, Any]:
        """The top-level keys, as written (not yet checked against the settings)."""
        return {key: value for key, value in self.data.items() if key not in TABLES}

    @property
    def auth_tokens(self) -> list[Any]:
        """The ``[auth] tokens`` entries, as written.

        Raises:
            ConfigError: ``[auth]`` holds anything else, or ``tokens`` is not a list.
        """
        table = self.data.get("auth", {})
        if not isinstance(table, dict) or set(table) - {"tokens"}:
            raise ConfigError(f"config file {self.path}: [auth] takes only `tokens`")
        entries = table.get("tokens", [])
        if not isinstance(entries, list):
            raise ConfigError(f"config file {self.path}: [auth] tokens must be a list of tables")
        return entries

    @property
    def tenant_tables(self) -> dict[str, dict[str, Any]]:
        """The ``[tenants.<name>]`` tables by name.

        Raises:
            ConfigError: ``tenants`` or one of its values is not a table.
        """
        tables = self.data.get("tenants", {})
        if not isinstance(tables, dict) or not all(isinstance(table, dict) for table in tables.values()):
            raise ConfigError(f"config file {self.path}: [tenants.<name>] must be tables")
        return {str(name): dict(table) for name, table in tables.items()}

    @property
    def secrets(self) -> object:
        """The ``[[secrets]]`` entries as written (None without any); :mod:`.secrets` checks them."""
        return self.data.get("secrets")

    @property
    def servers(self) -> object:
        """The ``[servers]`` table as written (None without one); the bridge checks its entries."""
        return self.data.get("servers")


def parse_config_file(text: str, path: Path) -> ConfigFile:
    """Parse ``text``, the contents of ``path``.

    Raises:
        ConfigError: it is not TOML.
    """
    import tomllib  # only when there is a file: most starts have none

    try:
        return ConfigFile(path, tomllib.loads(text))
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {path}: {exc}") from exc


def read_config_file(path: Path) -> ConfigFile:
    """Read and parse ``path`` (at start, and again when SIGHUP re-reads the tokens).

    Raises:
        ConfigError: it cannot be read, or is not TOML.
    """
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"config file {path}: {exc.strerror}") from exc
    return parse_config_file(text, path)
