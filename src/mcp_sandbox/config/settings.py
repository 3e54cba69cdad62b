"""The settings object: every setting, declared once with its default, description and check.

Built by :func:`mcp_sandbox.config.load_settings` (or :func:`~mcp_sandbox.config.load_config`)
from flags, environment and TOML file (see :mod:`.sources`). Each field is one
:func:`~.fields.setting`: the settings table (:mod:`.reference`), the environment variables and
the checks are all read from these declarations.
"""

# ruff: noqa: RUF009 - each default is a dataclasses.field made by setting(), which declares the field.

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path

from mcp_sandbox.config.defaults import (
    JS_RUNTIMES,
    OUTPUT_MODES,
    OutputMode,
    default_data_dir,
    default_gate_dir,
    default_js_runtime_dir,
    default_python_runtime,
    default_sandbox_ids,
    default_state_dir,
)
from mcp_sandbox.config.fields import (
    BYTES,
    DURATION,
    address_ranges,
    check_fields,
    computed,
    duration,
    duration_or_zero,
    host_id,
    http_url,
    internal,
    language_images,
    module_names,
    non_negative,
    one_of,
    port,
    ports,
    positive,
    positive_number,
    requirements,
    seconds,
    secret,
    setting,
    setting_fields,
)
from mcp_sandbox.config.tenants import Tenant
from mcp_sandbox.errors import ConfigError

__all__ = ["Settings"]

_DATA = "`/usr/local/lib/mcp-sandbox` as root, else `$XDG_DATA_HOME/mcp-sandbox`"


@dataclass(frozen=True, slots=True)
class Settings:
    """Every setting of mcp-sandbox. Build with :func:`~mcp_sandbox.config.load_settings`."""

    state_dir: Path = computed(
        lambda: default_state_dir(os.environ),
        "Workspaces, the metadata database and the server's secret.",
        "`/var/lib/mcp-sandbox` as root, else `$XDG_STATE_HOME/mcp-sandbox`",
        alias="MCP_BRIDGE_STATE_DIR",
    )
    backend: str = setting("bwrap", "The sandbox backend: `bwrap`, `podman`, `docker`, ...")
    servers_config: Path | None = setting(
        None, "A JSON file of downstream MCP servers (`mcpServers`/`servers`).", alias="MCP_SERVERS_CONFIG"
    )
    output_mode: OutputMode = setting(
        "compact",
        "How results are rendered as text: `compact`, `json` or `toon`.",
        check=one_of(OUTPUT_MODES),
        alias="MCP_BRIDGE_OUTPUT_MODE",
    )
    log_level: str = setting("WARNING", "The server's log level.", alias="MCP_BRIDGE_LOG_LEVEL")

    # Time limits.
    timeout: float = setting(30.0, "A run's time limit when it names none, seconds.", alias="MCP_BRIDGE_TIMEOUT")
    max_timeout: float = setting(
        120.0, "The longest time limit a run may ask for, seconds.", alias="MCP_BRIDGE_MAX_TIMEOUT"
    )

    # Resource limits, per run.
    memory: int = setting(512 << 20, "Memory of one run.", check=positive, unit=BYTES, alias="MCP_BRIDGE_MEMORY")
    pids: int = setting(128, "Processes and threads of one run.", check=positive, alias="MCP_BRIDGE_PIDS")
    cpus: float = setting(1.0, "CPUs of one run.", check=positive_number, alias="MCP_BRIDGE_CPUS")
    tmp_size: int = setting(64 << 20, "The size of a run's /tmp.", check=positive, unit=BYTES)
    scratch_size: int = setting(
        256 << 20, "What a run without a conversation may write to /workspace.", check=positive, unit=BYTES
    )
    max_output: int = setting(1 << 20, "stdout and stderr kept of one run.", check=positive, unit=BYTES)
    max_file_size: int = setting(256 << 20, "The largest file a run may write.", check=positive, unit=BYTES)
    open_files: int = setting(256, "Open files of one run.", check=positive)

    # The unprivileged host uid/gid behind the sandbox when the server runs as root.
    sandbox_uid: int = computed(
        lambda: default_sandbox_ids()[0],
        "The host uid the sandbox runs as when the server runs as root.",
        "the `mcp-sandbox` user's, else 65534",
        check=host_id,
    )
    sandbox_gid: int = computed(
        lambda: default_sandbox_ids()[1],
        "The host gid the sandbox runs as when the server runs as root.",
        "the `mcp-sandbox` user's, else 65534",
        check=host_id,
    )

    # Sandbox runtimes and binaries; a checkout's .runtime, built by `make`, wins unless data_dir is given.
    data_dir: Path = computed(
        lambda: default_data_dir(os.environ), "Where `mcp-sandbox setup` builds the sandbox's runtimes.", _DATA
    )
    python_runtime: Path = computed(
        lambda: default_python_runtime(default_data_dir(os.environ)),
        "The sandbox's Python runtime.",
        "the checkout's `.runtime/python`, else `data_dir/python`",
    )
    runtime_packages: tuple[str, ...] = setting(
        (), "Requirements `mcp-sandbox setup` adds to the sandbox's Python runtime.", check=requirements
    )
    bwrap_path: Path | None = setting(None, "The bwrap binary (default: found on PATH).")
    js_runtime: str = setting("bun", "The TypeScript/JavaScript runtime: `bun` or `deno`.", check=one_of(JS_RUNTIMES))
    js_runtime_dir: Path = computed(
        lambda: default_js_runtime_dir(default_data_dir(os.environ)),
        "Where `make` or `setup` installed the JavaScript runtimes.",
        "the checkout's `.runtime/js`, else `data_dir/js`",
    )
    gate_dir: Path = computed(
        lambda: default_gate_dir(default_data_dir(os.environ)),
        "Where `make` or `setup` built the sandbox's gate (a static program).",
        "the checkout's `.runtime/gate`, else `data_dir/gate`",
    )
    accept_weaker_isolation: bool = setting(
        False, "Start even where the backend cannot enforce part of the policy (it is logged)."
    )

    # Container backends (podman/docker).
    container_runtime: str | None = setting(
        None, "The container CLI (a name on PATH or a path).", alias="MCP_BRIDGE_RUNTIME"
    )
    image: str | None = setting(
        None, "The image of every language unless `images` names one.", alias="MCP_BRIDGE_IMAGE"
    )
    images: tuple[str, ...] = setting((), "Images by language: `python=IMAGE,typescript=IMAGE`.", check=language_images)

    # Code mode: downstream MCP servers called from sandboxed code.
    discover_servers: bool = setting(
        True, "Read the MCP client configs of the user (Claude, Cursor, VS Code, ...) for servers."
    )
    max_tool_calls: int = setting(200, "Tool calls of one run.", check=positive)
    max_calls_in_flight: int = setting(
        64, "Requests of one run answered at once; more wait their turn.", check=positive
    )
    max_call_bytes: int = setting(
        1 << 20, "One request from the sandbox (a tool call's arguments).", check=positive, unit=BYTES
    )
    max_tool_result_bytes: int = setting(64 << 20, "All tool results of one run together.", check=positive, unit=BYTES)
    tool_timeout: float = setting(60.0, "One tool call, seconds.", check=seconds)
    connect_timeout: float = setting(
        30.0, "Starting a downstream server and listing its tools, seconds.", check=seconds
    )

    # The HTTP service (serve --transport http).
    host: str = setting("127.0.0.1", "The address the HTTP service listens on.")
    port: int = setting(8765, "The port the HTTP service listens on.", check=port)
    public_url: str | None = setting(
        None,
        "The base URL clients reach this server at (default `http://host:port`).",
        check=http_url,
        alias="PUBLIC_BASE_URL",
    )
    allowed_hosts: tuple[str, ...] = setting((), "Host header values accepted besides the loopback ones.")
    allowed_origins: tuple[str, ...] = setting((), "Origin header values accepted besides the loopback ones.")
    token: str | None = setting(
        None,
        "The bearer token of tenant `default` (more tenants: `[auth] tokens`).",
        alias="MCP_API_TOKEN",
        secret=True,
    )
    token_file: Path | None = setting(None, "A file holding tenant `default`'s token; re-read on SIGHUP.")
    metrics_token: str | None = setting(
        None, "The bearer token of `GET /metrics`; without one /metrics is off.", check=secret, secret=True
    )
    max_request_size: int = setting(4 << 20, "One MCP request body.", check=positive, unit=BYTES)
    url_ttl: float = setting(3600.0, "The lifetime of a signed download URL.", check=duration, unit=DURATION)
    shutdown_grace: float = setting(
        10.0, "How long running executions may finish when the server stops.", check=duration_or_zero, unit=DURATION
    )

    # Conversations: persistent workspaces, their quotas and retention.
    quota_bytes: int = setting(1 << 30, "The files of one conversation.", check=positive, unit=BYTES)
    quota_files: int = setting(10_000, "Files of one conversation.", check=positive)
    conversation_ttl: float = setting(
        30 * 86400.0, "An idle conversation's files are deleted after this.", check=duration, unit=DURATION
    )
    max_workspaces_bytes: int = setting(
        20 << 30, "All conversations together; the least recently used go first.", check=positive, unit=BYTES
    )
    library_bytes: int = setting(1 << 20, "A tenant's library (saved tools and memories).", unit=BYTES)
    library_entries: int = setting(1000, "Entries of a tenant's library.")

    # Stateful sessions: a conversation's interpreter kept between runs.
    sessions: bool = setting(True, "Keep a conversation's interpreter between runs.")
    session_ttl: float = setting(
        600.0, "An idle session's interpreter is stopped after this (its files stay).", check=duration, unit=DURATION
    )
    max_sessions: int = setting(16, "Live interpreters; the least recently used idle one makes room.", check=positive)
    session_cpu_seconds: int = setting(3600, "CPU seconds one session's interpreter may use in all.", check=positive)
    stdio_conversation: str | None = setting(None, "Over stdio, the conversation a call that names none uses.")

    # Warm sandboxes: zygotes that fork a fresh interpreter per run (runs without a conversation).
    pool_size: int = setting(
        4, "Warm sandboxes at most (0: every run starts a sandbox of its own).", check=non_negative
    )
    pool_min: int = setting(1, "Warm sandboxes kept while idle.", check=non_negative)
    pool_idle: float = setting(
        300.0, "A warm sandbox unused this long is stopped (down to `pool_min`).", check=duration, unit=DURATION
    )
    pool_preload: tuple[str, ...] = setting(
        ("numpy", "pandas"), "Modules imported once, in every warm sandbox.", check=module_names
    )
    prestart_size: int | None = setting(
        None, "Pre-started single-use sandboxes per language (default: each language's own).", check=non_negative
    )

    # Admission control.
    max_concurrent_runs: int = setting(4, "Runs at once, of all kinds.", check=positive)
    max_queued_runs: int = setting(64, "Runs waiting for a slot.", check=non_negative)
    queue_timeout: float = setting(30.0, "How long a run may wait for a slot.", check=duration, unit=DURATION)

    # Per-tenant caps; None: decided by the server (TENANT_DEFAULTS with several tenants, else server-wide).
    tenant_concurrent_runs: int | None = setting(
        None,
        "Runs of one tenant executing at once (unset: 2 with several tenants, else no cap of its own).",
        check=positive,
    )
    tenant_queued_runs: int | None = setting(
        None, "Runs of one tenant waiting for a slot (unset: 16 with several tenants).", check=non_negative
    )
    tenant_sessions: int | None = setting(
        None, "Live session interpreters of one tenant (unset: 8 with several tenants).", check=positive
    )
    tenant_workspaces_bytes: int | None = setting(
        None,
        "All conversations of one tenant, its least recently used first (unset: 5g with several tenants).",
        check=positive,
        unit=BYTES,
    )
    retention_interval: float = setting(
        300.0, "Time between retention sweeps (one also runs at start).", check=duration, unit=DURATION
    )
    tenant_http_sessions: int | None = setting(
        None, "MCP sessions over HTTP of one tenant (unset: 32 with several tenants).", check=positive
    )
    max_http_sessions: int = setting(1024, "MCP sessions over HTTP in all.", check=positive)
    http_session_ttl: float = setting(
        600.0, "An idle MCP session over HTTP is closed after this.", check=duration, unit=DURATION
    )
    header_timeout: float = setting(10.0, "Request headers must arrive within this.", check=duration, unit=DURATION)
    keep_alive_timeout: float = setting(
        5.0, "An idle keep-alive connection is closed after this.", check=duration, unit=DURATION
    )
    max_connections_per_address: int = setting(64, "Connections of one client address.", check=positive)
    body_timeout: float = setting(30.0, "A request body must send a chunk within this.", check=duration, unit=DURATION)
    body_min_rate: int = setting(
        16 << 10,
        "The average rate a request body must keep after `body_timeout` (bytes/s).",
        check=positive,
        unit=BYTES,
    )
    tenant_uploads: int = setting(4, "Uploads one tenant streams at once.", check=positive)
    upload_workers: int = setting(8, "Threads writing uploads (never the threads runs use).", check=positive)

    # Images a run saves or shows, returned to the model as MCP image content.
    max_images: int = setting(4, "Images returned of one run.", check=non_negative)
    max_image_bytes: int = setting(1 << 20, "The largest image returned.", check=positive, unit=BYTES)

    # Controlled network (`network` of run_code/run_python); per tenant: [tenants.<name>].
    egress_allow: tuple[str, ...] = setting(
        (), "Domains a run with network may reach (`example.com`, `*.example.com`, `*`)."
    )
    egress_deny: tuple[str, ...] = setting((), "Domains refused even where `egress_allow` names them.")
    egress_ports: tuple[int, ...] = setting((80, 443), "Ports a run with network may connect to.", check=ports)
    egress_allow_private: tuple[str, ...] = setting(
        (), "Non-public address ranges (CIDRs) a run with network may reach.", check=address_ranges
    )
    egress_max_bytes: int = setting(
        256 << 20, "Both directions of all connections of one run.", check=positive, unit=BYTES
    )
    egress_max_connections: int = setting(256, "Connections of one run.", check=positive)
    egress_connection_timeout: float = setting(
        300.0, "The longest one connection may stay open.", check=duration, unit=DURATION
    )

    # Not settings anyone gives: the TOML file the settings came from, and its [tenants.<name>] tables.
    config_file: Path | None = internal(None)
    tenants: tuple[Tenant, ...] = internal(())

    def __post_init__(self) -> None:
        check_fields(self, SETTINGS)
        if not 0 < self.timeout <= self.max_timeout:
            raise ConfigError(f"timeout: {self.timeout} must be > 0 and <= max_timeout ({self.max_timeout})")
        if not (math.isfinite(self.timeout) and math.isfinite(self.max_timeout)):
            raise ConfigError("timeout: must be a finite number of seconds")
        if self.pool_min > self.pool_size:
            raise ConfigError(f"pool_min: {self.pool_min} is more than pool_size ({self.pool_size})")

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


# Every setting by name, in declaration order: the one table sources, checks and docs read.
SETTINGS = setting_fields(Settings)
