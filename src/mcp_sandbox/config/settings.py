"""The settings object: every setting, its default and the checks of its value.

Built by :func:`mcp_sandbox.config.load_settings` from flags, environment and TOML file (see
:mod:`.sources`); defaults that depend on the host (the state directory, the sandbox's ids,
the runtimes ``make`` builds) are computed here, when a :class:`Settings` is made.
"""

from __future__ import annotations

import ipaddress
import math
import os
import pwd
import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, get_args

from mcp_sandbox.errors import ConfigError

__all__ = [
    "JS_RUNTIMES",
    "OUTPUT_MODES",
    "SANDBOX_USER",
    "TENANT_DEFAULTS",
    "OutputMode",
    "Settings",
    "default_data_dir",
    "default_gate_dir",
    "default_js_runtime_dir",
    "default_python_runtime",
    "default_sandbox_ids",
    "default_state_dir",
]

OutputMode = Literal["compact", "json", "toon"]
OUTPUT_MODES: tuple[str, ...] = get_args(OutputMode)


def default_state_dir(env: Mapping[str, str]) -> Path:
    """Where state lives unless configured: a system directory for root, XDG state otherwise."""
    # Root's home is 0700, and the sandbox (run as an unprivileged uid) must reach workspaces.
    if os.geteuid() == 0:
        return Path("/var/lib/mcp-sandbox")
    base = env.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "mcp-sandbox"


SANDBOX_USER = "mcp-sandbox"
_NOBODY = 65534


def default_sandbox_ids() -> tuple[int, int]:
    """The dedicated ``mcp-sandbox`` system user's uid/gid (``make`` creates it), else nobody's."""
    try:
        entry = pwd.getpwnam(SANDBOX_USER)
    except KeyError:
        return _NOBODY, _NOBODY
    return entry.pw_uid, entry.pw_gid


# --- where the sandbox's runtimes live (issue 15: `mcp-sandbox setup`) -----------------------


def default_data_dir(env: Mapping[str, str]) -> Path:
    """Where ``mcp-sandbox setup`` builds the sandbox's runtimes unless configured.

    Root: a system directory, since the sandbox's uid must read the runtime and root's home is
    0700. Anyone else: ``$XDG_DATA_HOME/mcp-sandbox``, else ``~/.local/share/mcp-sandbox``.
    """
    if os.geteuid() == 0:
        return Path("/usr/local/lib/mcp-sandbox")
    base = env.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "mcp-sandbox"


def _checkout_runtime() -> Path:
    # `make` builds the sandbox's runtimes in the checkout, next to the server's venv.
    return Path(sys.prefix).resolve().parent / ".runtime"


def default_python_runtime(data_dir: Path, *, checkout: bool = True) -> Path:
    """The checkout's ``.runtime/python`` when ``make`` built one (and ``checkout``), else ``data_dir/python``."""
    built = _checkout_runtime() / "python"
    return built if checkout and (built / "bin" / "python3").exists() else data_dir / "python"


def default_js_runtime_dir(data_dir: Path, *, checkout: bool = True) -> Path:
    """The checkout's ``.runtime/js`` when ``make`` built one (and ``checkout``), else ``data_dir/js``."""
    built = _checkout_runtime() / "js"
    return built if checkout and (built / "node_modules").is_dir() else data_dir / "js"


def default_gate_dir(data_dir: Path, *, checkout: bool = True) -> Path:
    """The checkout's ``.runtime/gate`` when ``make`` built the gate (and ``checkout``), else ``data_dir/gate``."""
    built = _checkout_runtime() / "gate"
    return built if checkout and built.is_dir() else data_dir / "gate"


def _check_requirement(text: str) -> None:
    from packaging.requirements import InvalidRequirement, Requirement

    # An option (`--index-url ...`, `-e ...`) would be one to pip, not a package.
    if text.startswith("-"):
        raise ConfigError(f"runtime_packages: {text!r} is an option, not a requirement (e.g. scipy==1.14.1)")
    try:
        Requirement(text)
    except InvalidRequirement as exc:
        raise ConfigError(f"runtime_packages: {text!r} is not a requirement: {exc}") from exc


# --- end of the runtimes' defaults -----------------------------------------------------------


JS_RUNTIMES = ("bun", "deno")

# The per-tenant caps a server with several tenants applies where the settings give none.
TENANT_DEFAULTS: Mapping[str, int] = {
    "tenant_concurrent_runs": 2,
    "tenant_queued_runs": 16,
    "tenant_sessions": 8,
    "tenant_workspaces_bytes": 5 << 30,
    "tenant_http_sessions": 32,
}


@dataclass(frozen=True, slots=True)
class Settings:
    """Every setting of mcp-sandbox. Build with :func:`load_settings`."""

    state_dir: Path = field(default_factory=lambda: default_state_dir(os.environ))
    backend: str = "bwrap"
    servers_config: Path | None = None
    output_mode: OutputMode = "compact"
    log_level: str = "WARNING"

    # Time limits (seconds).
    timeout: float = 30.0
    max_timeout: float = 120.0

    # Resource limits, per run.
    memory: int = 512 << 20
    pids: int = 128
    cpus: float = 1.0
    tmp_size: int = 64 << 20
    # A run without a conversation: its /workspace holds at most this (a tmpfs under bwrap).
    scratch_size: int = 256 << 20
    max_output: int = 1 << 20
    max_file_size: int = 256 << 20
    open_files: int = 256

    # The unprivileged host uid/gid behind the sandbox when the server runs as root.
    sandbox_uid: int = field(default_factory=lambda: default_sandbox_ids()[0])
    sandbox_gid: int = field(default_factory=lambda: default_sandbox_ids()[1])

    # Sandbox runtimes and binaries. data_dir: where `mcp-sandbox setup` builds them (python/,
    # js/); a checkout's .runtime, built by `make`, is used instead when there is one.
    data_dir: Path = field(default_factory=lambda: default_data_dir(os.environ))
    python_runtime: Path = field(default_factory=lambda: default_python_runtime(default_data_dir(os.environ)))
    # Requirement strings `mcp-sandbox setup` adds to the sandbox's Python runtime (host side).
    runtime_packages: tuple[str, ...] = ()
    bwrap_path: Path | None = None
    # TypeScript/JavaScript: which runtime (bun or deno), and where `make` or `setup` installed them.
    js_runtime: str = "bun"
    js_runtime_dir: Path = field(default_factory=lambda: default_js_runtime_dir(default_data_dir(os.environ)))
    # Where `make` or `setup` built the sandbox's gate (sandbox/gate.c), a static program.
    gate_dir: Path = field(default_factory=lambda: default_gate_dir(default_data_dir(os.environ)))
    accept_weaker_isolation: bool = False

    # Container backends (podman/docker); the earlier bridge's names. container_runtime: the CLI
    # (a name on PATH or a path); image: the image of every language unless `images` names one
    # ("python=localhost/mcp-sandbox-python:latest,typescript=...").
    container_runtime: str | None = None
    image: str | None = None
    images: tuple[str, ...] = ()

    # Code mode: downstream MCP servers called from sandboxed code.
    # Discover servers in the MCP client configs of the user (Claude, Cursor, VS Code, ...) as
    # well as in servers_config and [servers]; off, only those two are read.
    discover_servers: bool = True
    max_tool_calls: int = 200  # per run
    max_calls_in_flight: int = 64  # requests of one run answered at once; more wait their turn
    max_call_bytes: int = 1 << 20  # one request frame from the sandbox (a tool call's arguments)
    max_tool_result_bytes: int = 64 << 20  # per run, the sum of all tool results
    tool_timeout: float = 60.0  # per tool call, seconds
    connect_timeout: float = 30.0  # starting a downstream server and listing its tools

    # The HTTP service (serve --transport http).
    host: str = "127.0.0.1"
    port: int = 8765
    # The base URL clients reach this server at, for download links (default http://host:port).
    public_url: str | None = None
    # Host / Origin header values accepted besides the loopback ones (DNS-rebinding protection).
    allowed_hosts: tuple[str, ...] = ()
    allowed_origins: tuple[str, ...] = ()
    # One bearer token for tenant "default" (more tenants: [auth] tokens in the TOML file).
    token: str | None = field(default=None, repr=False)
    # A file holding tenant "default"'s token (a container secret, a systemd credential); re-read on SIGHUP.
    token_file: Path | None = None
    # The bearer token of GET /metrics (Prometheus text); without one /metrics is off.
    metrics_token: str | None = field(default=None, repr=False)
    max_request_size: int = 4 << 20  # one MCP request body
    url_ttl: float = 3600.0  # lifetime of a signed download URL
    shutdown_grace: float = 10.0  # how long running executions may finish when the server stops

    # Conversations: persistent workspaces, their quotas and retention.
    quota_bytes: int = 1 << 30  # per conversation
    quota_files: int = 10_000  # per conversation
    conversation_ttl: float = 30 * 86400.0  # an idle conversation's files are deleted after this
    max_workspaces_bytes: int = 20 << 30  # all conversations together; least recently used go first
    # A tenant's library (saved tools and memories): bytes and entries.
    library_bytes: int = 1 << 20
    library_entries: int = 1000

    # Stateful sessions: a conversation's interpreter kept between runs.
    sessions: bool = True
    session_ttl: float = 600.0  # an idle session's interpreter is stopped (its files stay)
    max_sessions: int = 16  # live interpreters; the least recently used idle one makes room
    session_cpu_seconds: int = 3600  # CPU seconds one session's interpreter may use in all
    # Over stdio, the conversation a call that names none uses (the earlier bridge kept state by default).
    stdio_conversation: str | None = None

    # Warm sandboxes: zygotes that fork a fresh interpreter per run (runs without a conversation).
    pool_size: int = 4  # warm sandboxes at most (0: every run starts a sandbox of its own)
    pool_min: int = 1  # kept while idle
    pool_idle: float = 300.0  # a warm sandbox unused this long is stopped (down to pool_min)
    pool_preload: tuple[str, ...] = ("numpy", "pandas")  # imported once, in every warm sandbox
    # Pre-started single-use sandboxes per language, for runs that cannot fork from a zygote
    # (TypeScript/JavaScript; Python on a container backend); started on the language's first run.
    # None: each language's own default (engine/prestart.py, DEFAULT_SIZES).
    prestart_size: int | None = None

    # Admission control: runs at once (all kinds), and how many may wait, for how long.
    max_concurrent_runs: int = 4
    max_queued_runs: int = 64
    queue_timeout: float = 30.0

    # --- Per-tenant limits and the HTTP server's own bounds (a hostile tenant, issue 21) ---
    # Every tenant gets the same caps; one tenant at its caps never slows or evicts another.
    # None: decided by the server (TENANT_DEFAULTS with several tenants; with one, and for the
    # engine used on its own, the server-wide value: no cap of its own).
    tenant_concurrent_runs: int | None = None  # runs of one tenant executing at once
    tenant_queued_runs: int | None = None  # runs of one tenant waiting for a slot (the queue is round robin)
    tenant_sessions: int | None = None  # live session interpreters of one tenant
    tenant_workspaces_bytes: int | None = None  # all conversations of one tenant; its LRU go first
    retention_interval: float = 300.0  # seconds between retention sweeps (also one at start)
    # Downstream servers (code mode): tenants allowed on every server unless its entry names some.
    # HTTP: MCP sessions (Streamable HTTP and SSE), per tenant and in all, and their idle life.
    tenant_http_sessions: int | None = None
    max_http_sessions: int = 1024
    http_session_ttl: float = 600.0
    # HTTP: connections. Headers must arrive within header_timeout; an idle keep-alive connection
    # is closed after keep_alive_timeout; one client address holds at most this many connections.
    header_timeout: float = 10.0
    keep_alive_timeout: float = 5.0
    max_connections_per_address: int = 64
    # HTTP: request bodies (uploads, MCP requests) must send a chunk every body_timeout seconds
    # and average body_min_rate bytes/s after their first body_timeout seconds. Each tenant
    # streams at most tenant_uploads uploads at once, written by upload_workers threads of their
    # own (never the threads runs use).
    body_timeout: float = 30.0
    body_min_rate: int = 16 << 10
    tenant_uploads: int = 4
    upload_workers: int = 8
    # --- end of per-tenant limits ---

    # Images a run saves or shows, returned to the model as MCP image content.
    max_images: int = 4
    max_image_bytes: int = 1 << 20

    # Controlled network (run_code/run_python `network`): the host's egress proxy lets a run reach
    # the domains egress_allow names ("example.com", "*.example.com", "*" for any public host), not
    # those egress_deny names, on egress_ports; private, loopback, link-local and other non-public
    # addresses only where egress_allow_private names their range (CIDRs). Per tenant: [tenants.<name>].
    egress_allow: tuple[str, ...] = ()
    egress_deny: tuple[str, ...] = ()
    egress_ports: tuple[int, ...] = (80, 443)
    egress_allow_private: tuple[str, ...] = ()
    egress_max_bytes: int = 256 << 20  # per run, both directions of all its connections
    egress_max_connections: int = 256  # per run
    egress_connection_timeout: float = 300.0  # the longest one connection may stay open

    # The TOML file the settings came from (its [servers] table lists downstream servers).
    config_file: Path | None = None

    def __post_init__(self) -> None:
        if self.js_runtime not in JS_RUNTIMES:
            raise ConfigError(f"js_runtime: {self.js_runtime!r} is not one of {', '.join(JS_RUNTIMES)}")
        if self.output_mode not in OUTPUT_MODES:
            raise ConfigError(f"output_mode: {self.output_mode!r} is not one of {', '.join(OUTPUT_MODES)}")
        if not 0 < self.timeout <= self.max_timeout:
            raise ConfigError(f"timeout: {self.timeout} must be > 0 and <= max_timeout ({self.max_timeout})")
        for name in (
            "memory",
            "pids",
            "tmp_size",
            "scratch_size",
            "max_output",
            "max_file_size",
            "open_files",
            "max_tool_calls",
            "max_calls_in_flight",
            "max_call_bytes",
            "max_tool_result_bytes",
            "max_request_size",
            "quota_bytes",
            "quota_files",
            "max_workspaces_bytes",
            "max_sessions",
            "session_cpu_seconds",
            "max_image_bytes",
            "max_concurrent_runs",
            "egress_max_bytes",
            "egress_max_connections",
        ):
            if getattr(self, name) <= 0:
                raise ConfigError(f"{name}: must be positive")
        for name in ("pool_size", "pool_min", "prestart_size", "max_queued_runs"):
            if getattr(self, name) is not None and getattr(self, name) < 0:
                raise ConfigError(f"{name}: must not be negative")
        for name in ("tenant_concurrent_runs", "tenant_sessions", "tenant_workspaces_bytes", "tenant_http_sessions"):
            if getattr(self, name) is not None and getattr(self, name) <= 0:
                raise ConfigError(f"{name}: must be positive")
        for name in (
            "max_http_sessions",
            "max_connections_per_address",
            "tenant_uploads",
            "upload_workers",
            "body_min_rate",
        ):
            if getattr(self, name) <= 0:
                raise ConfigError(f"{name}: must be positive")
        if self.tenant_queued_runs is not None and self.tenant_queued_runs < 0:
            raise ConfigError("tenant_queued_runs: must not be negative")
        for name in (
            "retention_interval",
            "http_session_ttl",
            "header_timeout",
            "keep_alive_timeout",
            "body_timeout",
        ):
            if not math.isfinite(getattr(self, name)) or getattr(self, name) <= 0:
                raise ConfigError(f"{name}: must be a positive duration")
        if self.pool_min > self.pool_size:
            raise ConfigError(f"pool_min: {self.pool_min} is more than pool_size ({self.pool_size})")
        for module in self.pool_preload:
            if not all(part.isidentifier() for part in module.split(".")):
                raise ConfigError(f"pool_preload: {module!r} is not a module name")
        if not math.isfinite(self.cpus) or self.cpus <= 0:
            raise ConfigError("cpus: must be a positive number")
        if self.max_images < 0:
            raise ConfigError("max_images: must not be negative")
        if not 0 < self.port < 65536:
            raise ConfigError(f"port: {self.port} is not a TCP port")
        if self.public_url is not None and not re.match(r"^https?://[^/\s]+(/\S*)?$", self.public_url):
            raise ConfigError(f"public_url: {self.public_url!r} is not an http(s) URL")
        for port in self.egress_ports:
            if not 0 < port < 65536:
                raise ConfigError(f"egress_ports: {port} is not a TCP port")
        for cidr in self.egress_allow_private:
            try:
                ipaddress.ip_network(cidr, strict=False)
            except ValueError as exc:
                raise ConfigError(f"egress_allow_private: {cidr!r} is not an address range ({exc})") from exc
        for name in (
            "url_ttl",
            "conversation_ttl",
            "session_ttl",
            "pool_idle",
            "queue_timeout",
            "egress_connection_timeout",
        ):
            if not math.isfinite(getattr(self, name)) or getattr(self, name) <= 0:
                raise ConfigError(f"{name}: must be a positive duration")
        if not math.isfinite(self.shutdown_grace) or self.shutdown_grace < 0:
            raise ConfigError("shutdown_grace: must be a duration >= 0")
        for name in ("tool_timeout", "connect_timeout"):
            if not math.isfinite(getattr(self, name)) or getattr(self, name) <= 0:
                raise ConfigError(f"{name}: must be a positive number of seconds")
        if not (math.isfinite(self.timeout) and math.isfinite(self.max_timeout)):
            raise ConfigError("timeout: must be a finite number of seconds")
        for entry in self.images:
            language, _, image = entry.partition("=")
            if not language.strip() or not image.strip():
                raise ConfigError(f"images: {entry!r} is not LANGUAGE=IMAGE")
        for requirement in self.runtime_packages:
            _check_requirement(requirement)
        if self.metrics_token is not None and len(self.metrics_token.strip()) < 16:
            raise ConfigError("metrics_token: must be at least 16 characters (a random one: secrets.token_urlsafe(32))")
        for name in ("sandbox_uid", "sandbox_gid"):
            if not 0 <= getattr(self, name) < 2**32 - 1:
                raise ConfigError(f"{name}: must be a valid id")

    @property
    def base_url(self) -> str:
        """The URL this server's HTTP routes are reached at, without a trailing slash."""
        if self.public_url is not None:
            return self.public_url.rstrip("/")
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    @property
    def python_interpreter(self) -> Path:
        """The interpreter the sandbox runs (inside the runtime environment when there is one)."""
        return self.python_runtime / "bin" / "python3"
