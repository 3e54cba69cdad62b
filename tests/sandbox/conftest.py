"""Fixtures of the sandbox conformance suite: every test runs once per available backend.

A backend that is unavailable here is skipped with the probe's reason, unless the environment
variable ``MCP_SANDBOX_TEST_REQUIRE`` names it (``make test`` requires podman and docker, which it
installs; the tests start the docker engine themselves):
then the test fails instead, so CI cannot pass by skipping it.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from container_helpers import backend_flags
from mcp_sandbox.config import Settings, load_settings
from mcp_sandbox.engine.startup import backend_for, engine_for
from mcp_sandbox.sandbox.backends import BACKEND_NAMES, Backend, BackendProbe
from mcp_sandbox.sandbox.backends.container import ContainerBackend
from mcp_sandbox.state import StateLayout

from .harness import RunnerFactory, SandboxRunner

# Small limits keep the bombs quick; tests that need others pass their own.
_DEFAULT_FLAGS: dict[str, object] = {"memory": "256m", "pids": 64}


@pytest.fixture(scope="session")
def probed_backends() -> dict[str, Backend]:
    """One backend of each name in use, probed, whose container engine every test's backend shares
    (filled by ``backend_name`` on a backend's first test)."""
    return {}


@pytest.fixture(scope="session")
def backend_probes() -> dict[str, BackendProbe]:
    """Each backend's probe, made once per session on its first test (a probe starts a real sandbox)."""
    return {}


def _backend(name: str, settings: Settings, probed: Backend) -> Backend:
    """Backend ``name`` with ``settings``; a container one shares the probed one's engine (its
    facts read by `info`, its leftovers swept) instead of asking the engine again in every test."""
    if isinstance(probed, ContainerBackend):
        layout = StateLayout.of(settings.paths, settings.sandbox, settings.workspaces)
        return ContainerBackend(settings.sandbox, layout, name, probed.engine)
    return backend_for(settings, name)


@pytest.fixture(params=BACKEND_NAMES)
def backend_name(
    request: pytest.FixtureRequest, probed_backends: dict[str, Backend], backend_probes: dict[str, BackendProbe]
) -> str:
    name: str = request.param
    if name not in backend_probes:
        # Only a docker test starts the tests' own docker engine: a session running the bwrap half
        # alone (`make test`'s background lane, tests/conftest.py) never does.
        if name == "docker":
            request.getfixturevalue("docker_engine")
        probed_backends[name] = backend_for(load_settings(env={}, flags=backend_flags(name)), name)
        backend_probes[name] = probed_backends[name].probe()
    probe = backend_probes[name]
    if not probe.available:
        required = os.environ.get("MCP_SANDBOX_TEST_REQUIRE", "").split(",")
        if name in required:
            pytest.fail(f"backend {name} is required (MCP_SANDBOX_TEST_REQUIRE) but unavailable: {probe.reason}")
        pytest.skip(f"backend {name} is unavailable here: {probe.reason}")
    return name


@pytest.fixture
def backend_probe(backend_name: str, backend_probes: dict[str, BackendProbe]) -> BackendProbe:
    return backend_probes[backend_name]


@pytest.fixture
def state_root(state_dir: Path) -> Path:
    """A directory the sandbox's host uid can traverse (see the root conftest's ``state_dir``)."""
    return state_dir.parent


@pytest.fixture(params=["cold", "warm"])
def sandbox_kind(request: pytest.FixtureRequest) -> str:
    """Every attack runs in a sandbox started for the run and in a warm sandbox's forked child."""
    kind: str = request.param
    return kind


@pytest.fixture
def make_sandbox(
    backend_name: str,
    sandbox_kind: str,
    state_root: Path,
    sandbox_runtime: Path | None,
    probed_backends: dict[str, Backend],
) -> RunnerFactory:
    """``make_sandbox(**flags)``: an engine on the backend under test, with settings ``flags``.

    Warm: each run goes to a warm sandbox of a running engine (without preloaded modules, which
    would only slow the suite down; tests/engine/test_warm.py covers the default preload). The
    container backends keep no zygotes: there a warm run is a pre-started single-use container's,
    answered on its runner's DONE and judged by the counters then.
    """

    def make(**flags: object) -> SandboxRunner:
        values: dict[str, object] = {"state_dir": str(state_root / "state"), **_DEFAULT_FLAGS}
        values.update(backend_flags(backend_name))
        if sandbox_kind == "warm":
            values.update(pool_size=1, pool_min=1, pool_preload="", prestart_size=1)
        if sandbox_runtime is not None:
            values["python_runtime"] = str(sandbox_runtime)
        values.update(flags)
        settings = load_settings(env={}, flags=values)
        engine = engine_for(settings, _backend(backend_name, settings, probed_backends[backend_name]))
        kinds = {kind: sandbox_kind == kind for kind in ("warm", "fork", "born", "resumed")}
        return SandboxRunner(settings, engine, **kinds)

    return make


@pytest.fixture
def sandbox_ids(sandbox: SandboxRunner) -> tuple[int, int]:
    """The uid/gid code runs as inside: 65534, except in a rootful container (the host's sandbox uid)."""
    ids_inside = getattr(sandbox.engine.backend, "ids_inside", None)
    return ids_inside() if ids_inside is not None else (65534, 65534)


@pytest.fixture
def sandbox(make_sandbox: RunnerFactory) -> SandboxRunner:
    """An engine with the suite's default settings."""
    return make_sandbox()


@pytest.fixture
def workspace(state_root: Path, sandbox: SandboxRunner) -> Path:
    """A persistent workspace the test can inspect after the run (owned by the sandbox's host uid)."""
    directory = state_root / "workspace"
    directory.mkdir(mode=0o700)
    if os.geteuid() == 0:
        os.chown(directory, sandbox.settings.sandbox.sandbox_uid, sandbox.settings.sandbox.sandbox_gid)
    return directory
