"""Reading tenants from the config file's ``[tenants.<name>]`` tables, and finishing per-tenant caps.

A tenant's ``egress_allow``, ``egress_ports`` and ``egress_allow_private`` replace the global
settings; its ``egress_deny`` adds to the global one (a tenant never un-denies). Other keys of
its table are ignored. The caps a setting leaves at None are finished by :func:`with_tenant_caps`
once the server knows how many tenants it serves, which it also records (code mode's default
sharing depends on it).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from mcp_sandbox.config.settings import Settings
from mcp_sandbox.config.tenant import TENANT_DEFAULTS, Tenant
from mcp_sandbox.errors import ConfigError

__all__ = ["read_tenants", "with_tenant_caps"]


def _strings(value: object, where: str) -> tuple[str, ...]:
    if not isinstance(value, list | tuple) or not all(isinstance(item, str) for item in value):
        raise ConfigError(f"{where}: must be a list of strings")
    return tuple(value)


def _tenant(name: str, table: Mapping[str, Any], settings: Settings) -> Tenant:
    file = f"config file {settings.config_file}: " if settings.config_file is not None else ""
    where = f"{file}[tenants.{name}]"
    ports = table.get("egress_ports", list(settings.egress.egress_ports))
    if not isinstance(ports, list | tuple) or not all(type(port) is int and 0 < port < 65536 for port in ports):
        raise ConfigError(f"{where} egress_ports: must be a list of TCP ports")
    return Tenant(
        name=name,
        egress_allow=_strings(table.get("egress_allow", settings.egress.egress_allow), f"{where} egress_allow"),
        egress_deny=(*settings.egress.egress_deny, *_strings(table.get("egress_deny", []), f"{where} egress_deny")),
        egress_ports=tuple(ports),
        egress_allow_private=_strings(
            table.get("egress_allow_private", settings.egress.egress_allow_private),
            f"{where} egress_allow_private",
        ),
    )


def read_tenants(tables: Mapping[str, Mapping[str, Any]], settings: Settings) -> tuple[Tenant, ...]:
    """The tenants of ``[tenants.<name>]`` tables, over the global egress settings.

    Raises:
        ConfigError: a table's ``egress_*`` value is not a list of strings, or of TCP ports.
    """
    return tuple(_tenant(str(name), table, settings) for name, table in tables.items())


def with_tenant_caps(settings: Settings, tenants: int) -> Settings:
    """``settings`` for a server with ``tenants`` tenants: the per-tenant caps not given are
    ``TENANT_DEFAULTS`` with several tenants; with one (stdio, or HTTP with one token or none),
    the server's own, so they take nothing from its capacity."""
    given = {
        "tenant_concurrent_runs": settings.admission.tenant_concurrent_runs,
        "tenant_queued_runs": settings.admission.tenant_queued_runs,
        "tenant_sessions": settings.sessions.tenant_sessions,
        "tenant_workspaces_bytes": settings.workspaces.tenant_workspaces_bytes,
        "tenant_http_sessions": settings.http.tenant_http_sessions,
    }
    server_wide = {
        "tenant_concurrent_runs": settings.admission.max_concurrent_runs,
        "tenant_queued_runs": settings.admission.max_queued_runs,
        "tenant_sessions": settings.sessions.max_sessions,
        "tenant_workspaces_bytes": settings.workspaces.max_workspaces_bytes,
        "tenant_http_sessions": settings.http.max_http_sessions,
    }
    defaults = TENANT_DEFAULTS if tenants > 1 else server_wide
    finished = {name: value for name, value in defaults.items() if given[name] is None}
    return settings.replace(tenant_count=tenants, **finished)
