"""The pieces of the settings a run uses: limits, paths, sandbox, pool (a conversation's: :mod:`.conversations`).

Each a frozen piece of :class:`~mcp_sandbox.config.settings.Settings`, its fields declared with
:func:`~.fields.setting`; each checks its own values when made.
"""

# ruff: noqa: RUF009 - each default is a dataclasses.field made by setting(), which declares the field.

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path

from mcp_sandbox.config.defaults import (
    JS_RUNTIMES,
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
    check_fields,
    computed,
    duration,
    host_id_range,
    language_images,
    module_names,
    non_negative,
    one_of,
    positive,
    positive_number,
    requirements,
    sandbox_id,
    setting,
)
from mcp_sandbox.errors import ConfigError

__all__ = [
    "LimitSettings",
    "PathSettings",
    "PoolSettings",
    "SandboxSettings",
]

# Above useradd's subordinate ids (to 600100000) and systemd-nspawn's picked ranges (to
# 1879048191), below systemd's foreign range (2147352576) and 2**31 (signed uid_t).
DEFAULT_TENANT_UIDS = "1879048192-1879113727"

_DATA = "`/usr/local/lib/mcp-sandbox` as root, else `$XDG_DATA_HOME/mcp-sandbox`"


@dataclass(frozen=True, slots=True)
class LimitSettings:
    """What one run may use: time, memory, processes, files, output and images."""

    timeout: float = setting(30.0, "A run's time limit when it names none, seconds.", alias="MCP_BRIDGE_TIMEOUT")
    max_timeout: float = setting(
        120.0, "The longest time limit a run may ask for, seconds.", alias="MCP_BRIDGE_MAX_TIMEOUT"
    )
    memory: int = setting(
        512 << 20,
        "Memory per sandbox (cgroup), e.g. `256m`, `2g`.",
        check=positive,
        unit=BYTES,
        alias="MCP_BRIDGE_MEMORY",
    )
    pids: int = setting(128, "Processes and threads of one run.", check=positive, alias="MCP_BRIDGE_PIDS")
    cpus: float = setting(1.0, "CPU quota per sandbox (cgroup).", check=positive_number, alias="MCP_BRIDGE_CPUS")
    tmp_size: int = setting(
        64 << 20, "Size of the sandbox's `/tmp` (and, separately, of its `/dev/shm`).", check=positive, unit=BYTES
    )
    scratch_size: int = setting(
        256 << 20, "A run without a conversation: its `/workspace` holds at most this.", check=positive, unit=BYTES
    )
    max_output: int = setting(1 << 20, "stdout and stderr kept of one run.", check=positive, unit=BYTES)
    max_file_size: int = setting(
        256 << 20,
        (
            "Largest file the sandbox may write (RLIMIT_FSIZE; in a conversation, at most "
            "what its quota has left); a write past it ends the run (`SIGXFSZ`)."
        ),
        check=positive,
        unit=BYTES,
    )
    open_files: int = setting(256, "Open files of one run.", check=positive)
    max_images: int = setting(4, "Images returned of one run.", check=non_negative)
    max_image_bytes: int = setting(1 << 20, "The largest image returned.", check=positive, unit=BYTES)

    def __post_init__(self) -> None:
        check_fields(self)
        if not 0 < self.timeout <= self.max_timeout:
            raise ConfigError(f"timeout: {self.timeout} must be > 0 and <= max_timeout ({self.max_timeout})")
        if not (math.isfinite(self.timeout) and math.isfinite(self.max_timeout)):
            raise ConfigError("timeout: must be a finite number of seconds")


@dataclass(frozen=True, slots=True)
class PathSettings:
    """Where state lives, and where the sandbox's runtimes and binaries are."""

    state_dir: Path = computed(
        lambda: default_state_dir(os.environ),
        "Workspaces, the metadata database, the server secret, generated tool stubs.",
        "`/var/lib/mcp-sandbox` as root, else `$XDG_STATE_HOME/mcp-sandbox`",
        alias="MCP_BRIDGE_STATE_DIR",
    )
    write_back_interval: float = setting(
        30.0,
        (
            "With `object_store_url`: how often what a conversation's session changes between calls "
            "(its background processes) is written back to the store, and once more when the session ends."
        ),
        check=duration,
        unit=DURATION,
    )
    data_dir: Path = computed(
        lambda: default_data_dir(os.environ),
        "Where `mcp-sandbox setup` builds the sandbox's runtimes (`python/`, `js/`).",
        _DATA,
    )
    python_runtime: Path = computed(
        lambda: default_python_runtime(default_data_dir(os.environ)),
        (
            "The sandbox's Python environment (`/usr`: the system's own interpreter and "
            "packages, as in a container image)."
        ),
        "the checkout's `.runtime/python`, else `data_dir/python`",
    )
    js_runtime_dir: Path = computed(
        lambda: default_js_runtime_dir(default_data_dir(os.environ)),
        (
            "Where `make` or `setup` installed the pinned bun and deno npm packages, and the "
            "runner's bundles (`runners/`)."
        ),
        "the checkout's `.runtime/js`, else `data_dir/js`",
    )
    gate_dir: Path = computed(
        lambda: default_gate_dir(default_data_dir(os.environ)),
        (
            "Where `make` or `setup` compiled the sandbox's gate "
            "(`<digest>/mcp-sandbox-gate`, from `sandbox/gate.c`), the program each bwrap "
            "sandbox's first process runs; without a build there, sandboxes start through "
            "`sh` and `setpriv`."
        ),
        "the checkout's `.runtime/gate`, else `data_dir/gate`",
    )
    bwrap_path: Path | None = setting(None, "The bwrap binary (default: found on PATH).")

    def __post_init__(self) -> None:
        check_fields(self)

    @property
    def python_interpreter(self) -> Path:
        """The interpreter the sandbox runs (inside the runtime environment when there is one)."""
        return self.python_runtime / "bin" / "python3"


@dataclass(frozen=True, slots=True)
class SandboxSettings:
    """The sandbox backend, its ids, runtimes and container images."""

    backend: str = setting(
        "bwrap",
        (
            "Sandbox backend: `bwrap`, `podman`, `docker`, or `container` (podman or docker, "
            "whichever is found; see [Container backends](containers.md))."
        ),
    )
    sandbox_uid: int = computed(
        lambda: default_sandbox_ids()[0],
        "The host uid the sandbox runs as when the server runs as root.",
        "the `mcp-sandbox` user's, else 65534",
        check=sandbox_id,
    )
    sandbox_gid: int = computed(
        lambda: default_sandbox_ids()[1],
        "The host gid the sandbox runs as when the server runs as root.",
        "the `mcp-sandbox` user's, else 65534",
        check=sandbox_id,
    )
    tenant_uid_range: str = setting(
        DEFAULT_TENANT_UIDS,
        (
            "Host uids (`FIRST-LAST`) a root server gives tenants, one each, so that per-user kernel "
            "counters (inotify, pipe buffers, processes, keyrings, message queues) are not shared "
            "between them; the `default` tenant keeps `sandbox_uid`. `off`: every tenant runs as "
            "`sandbox_uid`. No uid of it may be a user's in /etc/passwd or a subordinate one in "
            "/etc/subuid (checked at start)."
        ),
        check=host_id_range,
    )
    runtime_packages: tuple[str, ...] = setting(
        (),
        (
            'Requirement strings (`"scipy==1.14.1"`) `mcp-sandbox setup` adds to the '
            "sandbox's Python runtime, on the host side (sandboxed code never installs "
            "anything); a TOML list, or comma-separated (so a requirement with a comma goes "
            "in the TOML file)."
        ),
        check=requirements,
    )
    js_runtime: str = setting(
        "bun",
        ("The runtime of TypeScript/JavaScript runs: `bun` or `deno` (`MCP_SANDBOX_JS_RUNTIME`)."),
        check=one_of(JS_RUNTIMES),
    )
    accept_weaker_isolation: bool = setting(
        False, "Start even where the backend cannot enforce part of the policy (it is logged)."
    )
    container_runtime: str | None = setting(
        None, "`MCP_BRIDGE_RUNTIME`: the container CLI (a name on `PATH` or a path).", alias="MCP_BRIDGE_RUNTIME"
    )
    image: str | None = setting(
        None, "`MCP_BRIDGE_IMAGE`: the container image of every language.", alias="MCP_BRIDGE_IMAGE"
    )
    images: tuple[str, ...] = setting(
        (), "Per-language images, `python=IMAGE,typescript=IMAGE`, before `image`.", check=language_images
    )

    def __post_init__(self) -> None:
        check_fields(self)
        if self.sandbox_uid in self.tenant_uids:
            raise ConfigError(
                f"tenant_uid_range: {self.tenant_uid_range} includes sandbox_uid ({self.sandbox_uid}), "
                "the default tenant's; choose a range without it"
            )

    @property
    def tenant_uids(self) -> range:
        """The uids of ``tenant_uid_range`` (empty when ``off``)."""
        if self.tenant_uid_range == "off":
            return range(0)
        first, _, last = self.tenant_uid_range.partition("-")
        return range(int(first), int(last) + 1)


@dataclass(frozen=True, slots=True)
class PoolSettings:
    """Warm sandboxes (zygotes forking a fresh interpreter per run) and pre-started ones."""

    pool_size: int = setting(
        4,
        (
            "Warm sandboxes at most, per host uid (0: every run starts a sandbox of its own); a "
            "tenant's own uid's, at most `tenant_concurrent_runs` of them."
        ),
        check=non_negative,
    )
    pool_min: int = setting(1, "Warm sandboxes kept while idle.", check=non_negative)
    pool_idle: float = setting(
        300.0,
        (
            "A warm sandbox unused this long is stopped (down to `pool_min`); a tenant's own uid's "
            "warm and pre-started sandboxes, all of them."
        ),
        check=duration,
        unit=DURATION,
    )
    pool_preload: tuple[str, ...] = setting(
        ("numpy", "pandas"),
        (
            "Modules a preloading warm sandbox imports once, for runs whose code names one "
            "(comma-separated, or a TOML list)."
        ),
        check=module_names,
    )
    prestart_size: int | None = setting(
        None,
        (
            "Pre-started single-use sandboxes per language for runs that cannot fork from a "
            "zygote (TypeScript/JavaScript; Python on podman or docker), started on the "
            "language's first run (0: none); set, it applies to every language."
        ),
        check=non_negative,
    )

    def __post_init__(self) -> None:
        check_fields(self)
        if self.pool_min > self.pool_size:
            raise ConfigError(f"pool_min: {self.pool_min} is more than pool_size ({self.pool_size})")
