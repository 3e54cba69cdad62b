"""Sandbox backends by name, and a probe of each.

Backends are loaded by name on demand (the package ``backends/<package>/`` that makes it), so
a server on bwrap never imports the container backends; :func:`available_backends` says why
one is unavailable.
"""

from __future__ import annotations

import importlib

from mcp_sandbox.config import LimitSettings, PathSettings, SandboxSettings
from mcp_sandbox.errors import ConfigError
from mcp_sandbox.sandbox.backends.base import (
    Backend,
    BackendProbe,
    Capability,
    LimitEvents,
    Sandbox,
    SandboxOutcome,
)
from mcp_sandbox.state import StateLayout

__all__ = [
    "BACKEND_NAMES",
    "Backend",
    "BackendProbe",
    "Capability",
    "LimitEvents",
    "Sandbox",
    "SandboxOutcome",
    "available_backends",
    "get_backend",
]

BACKEND_NAMES: tuple[str, ...] = ("bwrap", "podman", "docker")
# Also accepted by get_backend: podman or docker, whichever is found first (the earlier
# bridge's order: container_runtime / MCP_BRIDGE_RUNTIME, podman, docker).
_ALIASES: tuple[str, ...] = ("container",)
# name -> package under mcp_sandbox.sandbox.backends; each defines `create(name, sandbox, paths, limits, layout)`.
_PACKAGES = {"bwrap": "bwrap", "podman": "container", "docker": "container", "container": "container"}


def get_backend(
    name: str, *, sandbox: SandboxSettings, paths: PathSettings, limits: LimitSettings, layout: StateLayout
) -> Backend:
    """Instantiate the backend called ``name``: ``sandbox``'s ids and images, ``paths``' bwrap and gate,
    ``limits`` (what its probe checks), ``layout`` (the state directory's, built once at start).

    Raises:
        ConfigError: no backend has that name.
    """
    if name not in _PACKAGES:
        raise ConfigError(f"backend: {name!r} is not one of {', '.join(BACKEND_NAMES + _ALIASES)}")
    module = importlib.import_module(f"mcp_sandbox.sandbox.backends.{_PACKAGES[name]}")
    backend: Backend = module.create(name, sandbox, paths, limits, layout)
    return backend


def available_backends(
    *, sandbox: SandboxSettings, paths: PathSettings, limits: LimitSettings, layout: StateLayout
) -> list[BackendProbe]:
    """Probe every known backend on this host, at once (each probe mostly waits for a sandbox it starts)."""
    from concurrent.futures import ThreadPoolExecutor

    backends = [get_backend(name, sandbox=sandbox, paths=paths, limits=limits, layout=layout) for name in BACKEND_NAMES]
    with ThreadPoolExecutor(max_workers=len(backends), thread_name_prefix="probe") as pool:
        return list(pool.map(lambda backend: backend.probe(), backends))
