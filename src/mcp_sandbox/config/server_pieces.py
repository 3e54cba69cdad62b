"""The pieces of the settings a server uses: code mode, the HTTP service and its tokens, egress, admission.

Each a frozen piece of :class:`~mcp_sandbox.config.settings.Settings`, its fields declared with
:func:`~.fields.setting`; each checks its own values when made.
"""

# ruff: noqa: RUF009 - each default is a dataclasses.field made by setting(), which declares the field.

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from mcp_sandbox.config.defaults import TOOL_RESULTS, ToolResults
from mcp_sandbox.config.fields import (
    BYTES,
    DURATION,
    address_ranges,
    check_fields,
    duration,
    duration_or_zero,
    http_url,
    internal,
    non_negative,
    one_of,
    port,
    ports,
    positive,
    seconds,
    secret,
    setting,
)
from mcp_sandbox.config.fields import port as tcp_port  # HttpSettings' field `port` shadows the check
from mcp_sandbox.config.secrets import SecretSpec
from mcp_sandbox.config.tenant import Tenant
from mcp_sandbox.errors import ConfigError

__all__ = [
    "AdmissionSettings",
    "AuthSettings",
    "CodeModeSettings",
    "EgressSettings",
    "HttpSettings",
    "check_internal_listener",
]


@dataclass(frozen=True, slots=True)
class CodeModeSettings:
    """Code mode: downstream MCP servers called from sandboxed code."""

    servers_config: Path | None = setting(
        None, "A JSON file of downstream MCP servers (`mcpServers`/`servers`).", alias="MCP_SERVERS_CONFIG"
    )
    discover_servers: bool = setting(
        True, "Read the MCP client configs of the user (Claude, Cursor, VS Code, ...) for servers."
    )
    max_tool_calls: int = setting(200, "Tool calls of one run.", check=positive)
    max_calls_in_flight: int = setting(
        64, "Requests of one run answered at once; more wait their turn.", check=positive
    )
    max_call_bytes: int = setting(
        1 << 20,
        ("One request from sandboxed code (a tool call's arguments); a larger one raises `MCPError` (kind `invalid`)."),
        check=positive,
        unit=BYTES,
    )
    max_tool_result_bytes: int = setting(
        64 << 20,
        "All tool results of one run together (and the most one downstream message may carry).",
        check=positive,
        unit=BYTES,
    )
    tool_timeout: float = setting(60.0, "One tool call, seconds.", check=seconds)
    tool_results: ToolResults = setting(
        "value",
        "What a tool call from sandboxed code returns: `value` (its structured content or parsed text) or `raw`"
        " (the whole call result, `content`/`structuredContent`/`isError`: the earlier bridge's shape).",
        check=one_of(TOOL_RESULTS),
    )
    connect_timeout: float = setting(
        30.0, "Starting a downstream server and listing its tools, seconds.", check=seconds
    )

    def __post_init__(self) -> None:
        check_fields(self)


@dataclass(frozen=True, slots=True)
class HttpSettings:
    """The HTTP service: address, request and connection bounds, MCP sessions (its tokens: :class:`AuthSettings`)."""

    host: str = setting("127.0.0.1", "The address the HTTP service listens on.")
    port: int = setting(8765, "The port the HTTP service listens on.", check=port)
    public_url: str | None = setting(
        None,
        ("The base URL clients reach the server at, for download links (`PUBLIC_BASE_URL` too)."),
        check=http_url,
        alias="PUBLIC_BASE_URL",
    )
    replica_ca: Path | None = setting(
        None,
        (
            "With an `https://` `replica_url`: a PEM file of the CAs the replicas' certificates are checked"
            " against on the internal hop, instead of the default bundle; with `internal_cert`, the CAs"
            " whose certificates the internal listener asks callers for (mutual TLS)"
            " ([Scaling out](scaling.md#the-internal-hop-what-a-captured-call-can-do-and-tls))."
        ),
    )
    internal_port: int | None = setting(
        None,
        (
            "With `replica_url`: the port of the replicas' own listener, the only one serving `/internal/`"
            " (the public port answers 404 there); `replica_url` names it. Unset: the public port serves"
            " `/internal/` too ([Scaling out](scaling.md#the-internal-listener))."
        ),
        check=tcp_port,
    )
    internal_host: str | None = setting(
        None, "The address the internal listener (`internal_port`) listens on (unset: `host`)."
    )
    internal_cert: Path | None = setting(
        None,
        (
            "A PEM certificate (chain) for the internal listener, which then speaks TLS only (`replica_url`"
            " `https://`); a replica presents it when it calls another. With `internal_key`."
        ),
    )
    internal_key: Path | None = setting(None, "The PEM private key of `internal_cert`.")
    internal_verify_clients: bool = setting(
        True,
        (
            "With `internal_cert` and `replica_ca`: the internal listener accepts only callers presenting"
            " a certificate signed by `replica_ca` (mutual TLS)."
        ),
    )
    allowed_hosts: tuple[str, ...] = setting((), "Host header values accepted besides the loopback ones.")
    allowed_origins: tuple[str, ...] = setting((), "Origin header values accepted besides the loopback ones.")
    max_request_size: int = setting(4 << 20, "Largest MCP request body.", check=positive, unit=BYTES)
    url_ttl: float = setting(3600.0, "The lifetime of a signed download URL.", check=duration, unit=DURATION)
    shutdown_grace: float = setting(
        10.0,
        (
            "HTTP only: after SIGTERM, how long running executions may finish while new ones "
            "are refused (stdio has no grace period)."
        ),
        check=duration_or_zero,
        unit=DURATION,
    )
    tenant_http_sessions: int | None = setting(
        None, "MCP sessions over HTTP of one tenant (unset: 32 with several tenants).", check=positive
    )
    max_http_sessions: int = setting(1024, "MCP sessions over HTTP in all.", check=positive)
    http_session_ttl: float = setting(
        600.0,
        ("An idle MCP session over HTTP is closed (Streamable HTTP: no request; SSE: no posted message)."),
        check=duration,
        unit=DURATION,
    )
    header_timeout: float = setting(
        10.0, "HTTP: a request's headers must arrive within this (against slowloris).", check=duration, unit=DURATION
    )
    keep_alive_timeout: float = setting(
        5.0, "An idle keep-alive connection is closed after this.", check=duration, unit=DURATION
    )
    max_connections_per_address: int = setting(
        64, "HTTP: open connections from one client address; past it `429` and closed.", check=positive
    )
    body_timeout: float = setting(30.0, "A request body must send a chunk within this.", check=duration, unit=DURATION)
    body_min_rate: int = setting(
        16 << 10,
        "The average rate a request body must keep after `body_timeout` (bytes/s).",
        check=positive,
        unit=BYTES,
    )
    tenant_uploads: int = setting(4, "Uploads one tenant streams at once.", check=positive)
    upload_workers: int = setting(8, "Threads writing uploads (never the threads runs use).", check=positive)

    def __post_init__(self) -> None:
        check_fields(self)

    @property
    def base_url(self) -> str:
        """The URL this server's HTTP routes are reached at, without a trailing slash."""
        if self.public_url is not None:
            return self.public_url.rstrip("/")
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"


@dataclass(frozen=True, slots=True)
class AuthSettings:
    """Who may call the HTTP service: tenant ``default``'s bearer token, and ``/metrics``' own.

    The other tenants' tokens are the TOML file's ``[auth] tokens`` (:mod:`.tokens` reads them all).
    """

    token: str | None = setting(
        None,
        ("`MCP_SANDBOX_TOKEN` (or `MCP_API_TOKEN`): the bearer token of tenant `default` (more: `[auth] tokens`)."),
        alias="MCP_API_TOKEN",
        secret=True,
    )
    token_file: Path | None = setting(
        None, "A file holding tenant `default`'s token (a container secret); re-read on SIGHUP."
    )
    metrics_token: str | None = setting(
        None, "The bearer token of `GET /metrics`; without it `/metrics` answers 404.", check=secret, secret=True
    )

    def __post_init__(self) -> None:
        check_fields(self)


@dataclass(frozen=True, slots=True)
class EgressSettings:
    """Controlled network: what a run with network may reach, and its caps."""

    egress_allow: tuple[str, ...] = setting(
        (),
        (
            "Domain patterns a run with `network` may reach: `example.com`, `*.example.com` "
            "(names under it), `*` (any public host). Empty: no network at all "
            "([Network](network.md))."
        ),
    )
    egress_deny: tuple[str, ...] = setting((), "Domains refused even where `egress_allow` names them.")
    egress_ports: tuple[int, ...] = setting((80, 443), "Ports a run with network may connect to.", check=ports)
    egress_allow_private: tuple[str, ...] = setting(
        (),
        (
            "Address ranges (CIDRs) a name may resolve to, or be given as, besides public "
            "addresses: loopback, private, link-local, metadata are refused otherwise."
        ),
        check=address_ranges,
    )
    egress_max_bytes: int = setting(
        256 << 20, "Both directions of all connections of one run.", check=positive, unit=BYTES
    )
    egress_max_connections: int = setting(256, "Connections of one run.", check=positive)
    egress_connection_timeout: float = setting(
        300.0, "The longest one connection may stay open.", check=duration, unit=DURATION
    )
    egress_upstream_ca: Path | None = setting(
        None,
        (
            "A PEM bundle the egress proxy trusts, besides the host's roots, for the hosts a secret "
            "goes to (internal services) ([Network](network.md#secrets))."
        ),
    )
    # Not settings anyone gives: each tenant's egress, from its [tenants.<name>] table, and the
    # secrets of [[secrets]] and MCP_SANDBOX_SECRET_<NAME>.
    tenants: tuple[Tenant, ...] = internal(())
    secrets: tuple[SecretSpec, ...] = internal(())

    def __post_init__(self) -> None:
        check_fields(self)


@dataclass(frozen=True, slots=True)
class AdmissionSettings:
    """Admission control: runs at once, how many may wait, for how long, and when a call becomes a task."""

    max_concurrent_runs: int = setting(4, "Runs at once, of all kinds.", check=positive)
    max_queued_runs: int = setting(64, "Runs waiting for a slot.", check=non_negative)
    queue_timeout: float = setting(30.0, "How long a run may wait for a slot.", check=duration, unit=DURATION)
    tenant_concurrent_runs: int | None = setting(
        None,
        "Runs of one tenant executing at once (unset: 2 with several tenants, else no cap of its own).",
        check=positive,
    )
    tenant_queued_runs: int | None = setting(
        None, "Runs of one tenant waiting for a slot (unset: 16 with several tenants).", check=non_negative
    )
    task_after: float = setting(
        5.0,
        (
            "A `run_python` or `run_code` call from a client that declared the 2026-07-28 tasks extension,"
            " still running after this, is answered with a task to poll (0: at once)."
        ),
        check=duration_or_zero,
        unit=DURATION,
    )

    def __post_init__(self) -> None:
        check_fields(self)


def check_internal_listener(http: HttpSettings, replica_url: str | None) -> None:
    """The internal listener's settings agree with each other and with ``replica_url``.

    Raises:
        ConfigError: naming the setting that does not fit.
    """
    if http.internal_port is not None:
        if replica_url is None:
            raise ConfigError("internal_port: the internal listener serves replicas: set replica_url too")
        if http.internal_port == http.port and (http.internal_host or http.host) == http.host:
            raise ConfigError(f"internal_port: {http.internal_port} is the public port too: choose another")
    if (http.internal_cert is None) != (http.internal_key is None):
        raise ConfigError("internal_cert and internal_key: set both (the certificate and its private key) or neither")
    if http.internal_cert is not None:
        if http.internal_port is None:
            raise ConfigError("internal_cert: TLS is served on the internal listener only: set internal_port too")
        if replica_url is not None and not replica_url.startswith("https://"):
            raise ConfigError("replica_url: the internal listener speaks TLS (internal_cert): make it https://")
