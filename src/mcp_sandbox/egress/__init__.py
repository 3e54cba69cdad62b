"""Controlled network: an allowlisting egress proxy per run, reached from the sandbox through a Unix socket.

A sandbox keeps its own network namespace with nothing but loopback. A run granted network
(``network: true`` or a list of domain patterns) gets, for its life, a proxy on the host
(:mod:`.proxy`) listening on a Unix socket (:mod:`.listener`) bound into the sandbox at
:data:`SOCKET_INSIDE`; the runner inside relays TCP connections to :data:`RELAY_ADDRESS` on the
sandbox's loopback to that socket, and :func:`sandbox_environment` points the usual proxy
variables there. What a run may
reach is decided by :mod:`.rules`; every connection is a line (:mod:`.audit`) of the egress log.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from mcp_sandbox.audit import AuditLog
from mcp_sandbox.egress.audit import AuditRecord
from mcp_sandbox.egress.listener import (
    BUNDLE_FILE,
    CA_FILE,
    SOCKET_NAME,
    remove_socket_directory,
    serve_egress,
    socket_directory,
)
from mcp_sandbox.egress.proxy import EgressProxy
from mcp_sandbox.egress.resolve import Resolver, hosts_resolver, system_resolver
from mcp_sandbox.egress.rules import EgressGrant, EgressRules, Refusal, TenantEgress, check_pattern

if TYPE_CHECKING:
    from mcp_sandbox.egress.authority import Authority

__all__ = [
    "PACKAGES_INSIDE",
    "RELAY_ADDRESS",
    "SOCKET_DIRECTORY_INSIDE",
    "SOCKET_INSIDE",
    "AuditLog",
    "AuditRecord",
    "Authority",
    "EgressGrant",
    "EgressProxy",
    "EgressRules",
    "Refusal",
    "Resolver",
    "TenantEgress",
    "check_pattern",
    "grant_environment",
    "hosts_resolver",
    "relay_environment",
    "remove_socket_directory",
    "sandbox_environment",
    "serve_egress",
    "socket_directory",
    "system_resolver",
    "trust_environment",
]

SOCKET_DIRECTORY_INSIDE = "/run/egress"
SOCKET_INSIDE = f"{SOCKET_DIRECTORY_INSIDE}/{SOCKET_NAME}"
RELAY_ADDRESS = ("127.0.0.1", 3128)
# Where `pip install` puts packages: in the conversation's workspace, on top of the runtime
# (the Python runner puts it on sys.path; see mcp_sandbox_runtime.relay).
PACKAGES_INSIDE = "/workspace/.packages/python"


def __getattr__(name: str) -> Any:
    """``Authority`` on first use: its module imports ``cryptography.x509`` (about 60 ms of a
    server's start), which only a server whose tenants have secrets needs."""
    if name == "Authority":
        from mcp_sandbox.egress.authority import Authority

        return Authority
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def relay_environment() -> Mapping[str, str]:
    """What the runner reads to start its relay (a sandbox that may get network, for life)."""
    return {
        "MCP_SANDBOX_EGRESS_SOCKET": SOCKET_INSIDE,
        "MCP_SANDBOX_EGRESS_RELAY": f"{RELAY_ADDRESS[0]}:{RELAY_ADDRESS[1]}",
    }


def trust_environment() -> Mapping[str, str]:
    """Where every common client finds the trust bundle holding the proxy's CA (a run with secrets)."""
    bundle, ca = f"{SOCKET_DIRECTORY_INSIDE}/{BUNDLE_FILE}", f"{SOCKET_DIRECTORY_INSIDE}/{CA_FILE}"
    names = ("SSL_CERT_FILE", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE", "PIP_CERT", "GIT_SSL_CAINFO")
    return {**dict.fromkeys(names, bundle), "NODE_EXTRA_CA_CERTS": ca, "DENO_CERT": ca}


def grant_environment(grant: EgressGrant | None) -> Mapping[str, str]:
    """What a run's grant changes in :func:`sandbox_environment`'s variables (in its EXEC frame).

    When the rules let it reach ``localhost`` (a loopback range in ``egress_allow_private`` and a
    pattern naming it), no name is left to bypass the proxy: the sandbox's own loopback serves
    nothing but the relay, so ``localhost``/``127.0.0.1`` must go through the proxy to the host's.
    With secrets: the trust bundle's variables, and each ``placeholder_env`` its run's placeholder.
    """
    if grant is None:
        return {}
    env: dict[str, str] = {}
    if grant.rules.reaches_loopback():
        env.update({"NO_PROXY": "", "no_proxy": ""})
    if grant.secrets:
        env.update(trust_environment())
        env.update({s.spec.placeholder_env: s.placeholder for s in grant.secrets if s.spec.placeholder_env})
    return env


def sandbox_environment(language: str) -> Mapping[str, str]:
    """The variables a run with network gets: the relay's, proxies for every common client, where packages go."""
    proxy = f"http://{RELAY_ADDRESS[0]}:{RELAY_ADDRESS[1]}"
    local = "localhost,127.0.0.1,::1"
    env = {
        **relay_environment(),
        **dict.fromkeys(("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy"), proxy),
        "NO_PROXY": local,
        "no_proxy": local,
        "npm_config_proxy": proxy,
        "npm_config_https_proxy": proxy,
        "npm_config_cache": "/tmp/.npm",
        "BUN_INSTALL_CACHE_DIR": "/tmp/.bun-cache",
        "PIP_PROXY": proxy,
        "PIP_DISABLE_PIP_VERSION_CHECK": "1",
    }
    if language == "python":
        env["PIP_TARGET"] = PACKAGES_INSIDE
    return env
