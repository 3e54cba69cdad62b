"""The container backends: podman and docker behind the same policy as bwrap.

``argv.py`` turns a policy into ``podman run`` / ``docker run`` (pure, snapshot-tested);
``engine.py`` drives the engine's CLI (facts, removal by name, the sweep by label);
``channel.py`` carries the channel into the container; ``sandbox.py`` starts and closes
containers; ``probe.py`` starts a real one to say what this host enforces.
"""

from __future__ import annotations

from mcp_sandbox.config import LimitSettings, PathSettings, SandboxSettings
from mcp_sandbox.errors import BackendUnavailableError, ConfigError
from mcp_sandbox.sandbox.backends.container.argv import (
    CHANNEL_DIR,
    CHANNEL_FD,
    CHANNEL_SOCKET,
    LABEL,
    NAME_PREFIX,
    OWNER_LABEL,
    ContainerRun,
    Flavour,
    container_argv,
    container_name,
    owner_of,
)
from mcp_sandbox.sandbox.backends.container.engine import ContainerEngine, detect_runtime, flavour_of
from mcp_sandbox.sandbox.backends.container.sandbox import DEFAULT_IMAGE, ContainerBackend, ContainerSandbox
from mcp_sandbox.state import StateLayout

__all__ = [
    "CHANNEL_DIR",
    "CHANNEL_FD",
    "CHANNEL_SOCKET",
    "DEFAULT_IMAGE",
    "LABEL",
    "NAME_PREFIX",
    "OWNER_LABEL",
    "ContainerBackend",
    "ContainerEngine",
    "ContainerRun",
    "ContainerSandbox",
    "container_argv",
    "container_name",
    "create",
    "detect_runtime",
    "owner_of",
]


def create(
    name: str, sandbox: SandboxSettings, paths: PathSettings, limits: LimitSettings, layout: StateLayout
) -> ContainerBackend:
    """The registry's constructor for ``podman``, ``docker`` and ``container`` (podman or docker,
    whichever :func:`detect_runtime` finds); ``paths`` and ``limits`` are bwrap's only.

    Raises:
        ConfigError: ``name`` is not a container backend.
    """
    if name == "container":
        try:
            found, dialect = detect_runtime(sandbox)
        except BackendUnavailableError:
            found, dialect = "podman", "podman"
        return ContainerBackend(sandbox, layout, "container", ContainerEngine(found, dialect))
    if name not in ("podman", "docker"):
        raise ConfigError(f"backend: {name!r} is not a container backend")
    flavour: Flavour = "podman" if name == "podman" else "docker"
    # container_runtime names the CLI of its own dialect only: a podman path is not docker's.
    configured = sandbox.container_runtime
    cli = configured if configured and flavour_of(configured) == flavour else None
    return ContainerBackend(sandbox, layout, name, ContainerEngine(cli or flavour, flavour))
