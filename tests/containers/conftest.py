"""Fixtures of the container tests: engines on podman and on docker, both for real."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from container_helpers import backend_flags
from mcp_sandbox.config import load_settings
from mcp_sandbox.engine import Engine
from mcp_sandbox.engine.startup import backend_for, engine_for
from mcp_sandbox.sandbox.backends import BackendProbe
from mcp_sandbox.sandbox.backends.container import ContainerBackend
from mcp_sandbox.state import StateLayout

_DEFAULT_FLAGS: dict[str, object] = {"memory": "256m", "pids": 64}

EngineFactory = Callable[..., Engine]


def _registry_name(kind: str) -> str:
    return "docker" if kind == "docker-via-podman" else kind


@pytest.fixture(scope="session")
def probed_container_backends(docker_engine: str | None) -> dict[str, ContainerBackend]:
    """One backend of each kind, probed, whose container engine every test's backend shares (its
    facts read by `info`, its leftovers swept) instead of asking the engine again in every test."""
    backends = {}
    for kind in ("podman", "docker"):
        backend = backend_for(load_settings(env={}, flags=backend_flags(kind)), _registry_name(kind))
        assert isinstance(backend, ContainerBackend)
        backends[kind] = backend
    return backends


@pytest.fixture(scope="session")
def container_probes(probed_container_backends: dict[str, ContainerBackend]) -> dict[str, BackendProbe]:
    return {kind: backend.probe() for kind, backend in probed_container_backends.items()}


@pytest.fixture(params=["podman", "docker"])
def container_kind(request: pytest.FixtureRequest, container_probes: dict[str, BackendProbe]) -> str:
    kind: str = request.param
    probe = container_probes[kind]
    if not probe.available:
        if kind in os.environ.get("MCP_SANDBOX_TEST_REQUIRE", "").split(","):
            pytest.fail(f"{kind} is required (MCP_SANDBOX_TEST_REQUIRE) but unavailable: {probe.reason}")
        pytest.skip(f"{kind} is unavailable here: {probe.reason}")
    return kind


@pytest.fixture
def make_container_engine(
    state_dir: Path,
    sandbox_runtime: Path | None,
    container_kind: str,
    probed_container_backends: dict[str, ContainerBackend],
) -> EngineFactory:
    """``make_container_engine(**flags)``: an engine on the container backend under test (sharing
    the probed backend's container engine: a test of the sweep builds a backend of its own)."""
    shared = probed_container_backends[container_kind].engine

    def make(**flags: Any) -> Engine:
        values: dict[str, Any] = {"state_dir": str(state_dir), **_DEFAULT_FLAGS, **backend_flags(container_kind)}
        if sandbox_runtime is not None:
            values["python_runtime"] = str(sandbox_runtime)
        values.update(flags)
        settings = load_settings(env={}, flags=values)
        layout = StateLayout.of(settings.paths, settings.sandbox, settings.workspaces)
        backend = ContainerBackend(settings.sandbox, layout, _registry_name(container_kind), shared)
        engine = engine_for(settings, backend, layout=layout)
        engine.prepare()
        return engine

    return make
