"""Fixtures of the engine suite: engines on the real bwrap backend, sessions running."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from mcp_sandbox.config import load_settings
from mcp_sandbox.engine import Engine
from mcp_sandbox.engine.startup import backend_for, engine_for
from mcp_sandbox.sandbox.backends import BackendProbe

# Small limits keep the tests quick; tests that need others pass their own.
_DEFAULT_FLAGS: dict[str, object] = {"memory": "256m", "pids": 64}

EngineFactory = Callable[..., Engine]
RunningEngine = Callable[..., contextlib.AbstractAsyncContextManager[Engine]]


@pytest.fixture(scope="session")
def bwrap_probe() -> BackendProbe:
    return backend_for(load_settings(env={}, flags={}), "bwrap").probe()


@pytest.fixture
def make_engine(state_dir: Path, sandbox_runtime: Path | None, bwrap_probe: BackendProbe) -> EngineFactory:
    """``make_engine(**flags)``: an engine on bwrap with settings ``flags`` (not running)."""
    if not bwrap_probe.available:
        pytest.skip(f"bwrap is unavailable here: {bwrap_probe.reason}")

    def make(**flags: Any) -> Engine:
        values: dict[str, Any] = {"state_dir": str(state_dir), **_DEFAULT_FLAGS}
        if sandbox_runtime is not None:
            values["python_runtime"] = str(sandbox_runtime)
        values.update(flags)
        settings = load_settings(env={}, flags=values)
        engine = engine_for(settings, backend_for(settings, "bwrap"))
        engine.prepare()
        return engine

    return make


@pytest.fixture
def running_engine(make_engine: EngineFactory) -> RunningEngine:
    """``async with running_engine(**flags) as engine``: an engine whose sessions work."""

    @contextlib.asynccontextmanager
    async def run(**flags: Any) -> AsyncIterator[Engine]:
        async with make_engine(**flags).running() as engine:
            yield engine

    return run
