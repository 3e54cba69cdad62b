"""The backend-neutral sandbox policy: frozen, deny-by-default.

A :class:`SandboxPolicy` says what one sandbox may do; each backend turns it into its own
argv with a pure function (see ``backends/bwrap/argv.py``) and says, through its probe, which
parts it can enforce on this host.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType

from mcp_sandbox.protocol import TOOLS_MOUNT

__all__ = ["SANDBOX_HOME", "TOOLS_MOUNT", "WORKSPACE", "WORKSPACE_ALIAS", "Limits", "Mount", "SandboxPolicy"]

WORKSPACE = "/workspace"
WORKSPACE_ALIAS = "/data"  # the earlier code runner's name for the same directory
SANDBOX_HOME = "/tmp"

_EMPTY_ENV: Mapping[str, str] = MappingProxyType({})


@dataclass(frozen=True, slots=True)
class Mount:
    """A host path made visible inside the sandbox (read-only unless ``writable``).

    ``system`` marks part of the host's base system (``/usr``, the linker's files): a backend
    that starts from an image (podman, docker) takes those from the image instead.
    """

    source: Path
    target: str
    writable: bool = False
    system: bool = False


@dataclass(frozen=True, slots=True)
class Limits:
    """Per-sandbox resource limits. Byte counts are bytes; times are seconds."""

    memory: int = 512 << 20
    pids: int = 128
    cpus: float = 1.0
    cpu_seconds: int = 60
    tmp_size: int = 64 << 20
    # A scratch workspace (a policy without one) on a backend that sizes it (bwrap: a tmpfs).
    workspace_size: int = 256 << 20
    file_size: int = 256 << 20
    open_files: int = 256
    # Whether RLIMIT_AS may stand in for memory where no memory cgroup can: False for runtimes
    # (V8, JavaScriptCore) that reserve gigabytes of address space they never touch.
    address_space: bool = True


@dataclass(frozen=True, slots=True)
class SandboxPolicy:
    """What one sandbox may do. Everything not named here is denied.

    Attributes:
        command: the argv run inside the sandbox (absolute paths as seen inside).
        mounts: read-only (or explicitly writable) host paths; the root is otherwise empty.
        symlinks: symlinks to create inside (usr-merged ``/lib`` and the like).
        workspace: host directory mounted read-write at ``/workspace`` (and ``/data``); None: a
            scratch workspace, a tmpfs of ``limits.workspace_size`` where the backend can size
            one (``sized_scratch``), which lives and dies with the sandbox.
        environment: the complete environment inside; nothing of the host's leaks in.
        network: whether the sandbox shares the host's network (never set by the engine: it
            would expose the server's own ports; controlled network is ``egress``).
        egress: the sandbox keeps its empty network namespace (loopback only) but may open TCP
            sockets, for the relay on its loopback to the host's egress proxy (a Unix socket
            among ``mounts``); UDP and raw sockets stay refused.
        uid, gid: the ids inside the sandbox.
        host_uid: the host uid a root server runs the sandbox as: its tenant's (see
            ``mcp_sandbox.tenant_uids``); None: ``sandbox_uid``. Ignored when the server is not
            root (the sandbox is then the server's uid, or a rootless engine's).
        limits: resource limits.
        language: the runtime this sandbox serves (``python``, ``typescript``); image-based
            backends pick their image by it.
    """

    command: tuple[str, ...]
    mounts: tuple[Mount, ...] = ()
    symlinks: tuple[tuple[str, str], ...] = ()  # (link target, path inside), e.g. ("usr/lib", "/lib")
    workspace: Path | None = None
    environment: Mapping[str, str] = field(default_factory=lambda: _EMPTY_ENV)
    network: bool = False
    egress: bool = False
    uid: int = 65534
    gid: int = 65534
    host_uid: int | None = None
    hostname: str = "sandbox"
    cwd: str = WORKSPACE
    limits: Limits = field(default_factory=Limits)
    language: str = "python"

    def __post_init__(self) -> None:
        if not self.command:
            raise ValueError("policy.command must not be empty")
        # Freeze the mapping so a policy cannot be changed after it was checked.
        object.__setattr__(self, "environment", MappingProxyType(dict(self.environment)))
