"""A tenant's settings (its egress rules) and the per-tenant caps a server of several tenants applies.

Read from the ``[tenants.<name>]`` tables and finished by :mod:`.tenant_tables`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

__all__ = ["TENANT_DEFAULTS", "Tenant"]

# The per-tenant caps a server with several tenants applies where the settings give none.
TENANT_DEFAULTS: Mapping[str, int] = {
    "tenant_concurrent_runs": 2,
    "tenant_queued_runs": 16,
    "tenant_sessions": 8,
    "tenant_workspaces_bytes": 5 << 30,
    "tenant_http_sessions": 32,
}


@dataclass(frozen=True, slots=True)
class Tenant:
    """A tenant's egress settings, the global ones with what its ``[tenants.<name>]`` table sets."""

    name: str
    egress_allow: tuple[str, ...]
    egress_deny: tuple[str, ...]
    egress_ports: tuple[int, ...]
    egress_allow_private: tuple[str, ...]
