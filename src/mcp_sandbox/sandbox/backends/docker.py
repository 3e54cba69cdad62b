"""The docker backend: containers started with `docker run` (see ``backends/container.py``)."""

from __future__ import annotations

from mcp_sandbox.config import Settings
from mcp_sandbox.sandbox.backends.container import ContainerBackend, create_named

__all__ = ["create"]


def create(settings: Settings) -> ContainerBackend:
    """The registry's constructor."""
    return create_named(settings, "docker")
