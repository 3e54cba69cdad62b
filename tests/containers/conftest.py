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

_DEFAULT_FLAGS: dict[str, object] = {"memory": "256m", "pids": 64}

EngineFactory = Callable[..., Engine]


def _registry_name(kind: str) -> str:
    return "docker" if kind == "docker-via-podman" else kind


@pytest.fixture(scope="session")
def container_probes(docker_engine: str | None) -> dict[str, BackendProbe]:
    return {
        kind: backend_for(load_settings(env={}, flags=backend_flags(kind)), _registry_name(kind)).probe()
        for kind in ("podman", "docker")
    }


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
def make_container_engine(state_dir: Path, sandbox_runtime: Path | None, container_kind: str) -> EngineFactory:
    """``make_container_engine(**flags)``: an engine on the container backend under test."""

    def make(**flags: Any) -> Engine:
        values: dict[str, Any] = {"state_dir": str(state_dir), **_DEFAULT_FLAGS, **backend_flags(container_kind)}
        if sandbox_runtime is not None:
            values["python_runtime"] = str(sandbox_runtime)
        values.update(flags)
        settings = load_settings(env={}, flags=values)
        engine = engine_for(settings, backend_for(settings, _registry_name(container_kind)))
        engine.prepare()
        return engine

    return make
