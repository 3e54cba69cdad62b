"""Fixtures shared by every suite: the anyio backend, the sandbox's runtime, reachable state directories,
settings for the sandbox test double; and the hook that marks the tests that need a real sandbox."""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from container_helpers import docker_daemon
from mcp_sandbox.config import Settings, load_settings
from mcp_sandbox.workspace import remove_tree
from postgres_helpers import Cluster, MetadataTarget, postgres_cluster
from s3_helpers import s3_server

if TYPE_CHECKING:  # imported where xdist calls the hook: pytest runs without xdist too (the vm-test guest)
    from xdist_scopes import CostFirstScheduling

_REPO_ROOT = Path(__file__).resolve().parents[1]
_RUNTIME = _REPO_ROOT / ".runtime" / "python"


@pytest.fixture(scope="session")
def docker_engine() -> Iterator[str | None]:
    """Debian's docker engine, run for this session where it can be (None), else why not."""
    with docker_daemon() as reason:
        yield reason


@pytest.fixture(scope="session")
def postgres() -> Iterator[Cluster]:
    """A throw-away PostgreSQL cluster for this session (tests/postgres_helpers.py)."""
    with postgres_cluster() as cluster:
        yield cluster


@pytest.fixture(scope="session")
def s3_endpoint() -> Iterator[str]:
    """A throw-away S3-compatible server (SeaweedFS) for this session: its endpoint URL (tests/s3_helpers.py)."""
    with s3_server() as endpoint:
        yield endpoint


@pytest.fixture(params=["sqlite", "postgresql"])
def metadata_target(request: pytest.FixtureRequest, tmp_path: Path) -> MetadataTarget:
    """Each engine of the metadata index in turn: the SQLite file in ``tmp_path``, or a new
    database of the session's PostgreSQL cluster (``database_url``)."""
    if request.param == "sqlite":
        return MetadataTarget("sqlite", tmp_path / "metadata.sqlite3")
    cluster: Cluster = request.getfixturevalue("postgres")
    return MetadataTarget("postgresql", tmp_path / "metadata.sqlite3", cluster.create_database())


@pytest.fixture(scope="session")
def anyio_backend() -> str:
    # Session scope: the module-scoped server fixtures are async too.
    return "asyncio"


@pytest.fixture(scope="session")
def sandbox_runtime() -> Path | None:
    """The sandbox's Python environment that `make` builds, or None to use the default (/usr)."""
    return _RUNTIME if (_RUNTIME / "bin" / "python3").exists() else None


@pytest.fixture(scope="session")
def packaged_runtime(sandbox_runtime: Path | None) -> Path:
    """The built runtime; fails (not skips) without it, since `make test` always builds it."""
    if sandbox_runtime is None:
        pytest.fail(f"the sandbox's runtime {_RUNTIME} is not built: run `make runtime`", pytrace=False)
    return sandbox_runtime


def _reachable_state_dir() -> Iterator[Path]:
    # Not tmp_path: /tmp/pytest-of-<user> is 0700, and when the server runs as root the sandbox's
    # uid must traverse to its workspace, so open_engine refuses a state dir under it.
    parent = Path(tempfile.mkdtemp(prefix="mcp-sandbox-test-"))
    parent.chmod(0o711)
    try:
        yield parent / "state"
    finally:
        remove_tree(parent)  # not shutil.rmtree: sandboxes leave trees deeper than its recursion


@pytest.fixture
def state_dir() -> Iterator[Path]:
    yield from _reachable_state_dir()


@pytest.fixture(scope="module")
def module_state_dir() -> Iterator[Path]:
    yield from _reachable_state_dir()


@pytest.fixture
def plain_settings(state_dir: Path) -> Callable[..., Settings]:
    """``plain_settings(**flags)``: settings for an engine on the test double (tests/doubles/sandbox.py).

    Nothing pre-started: a pre-started Python sandbox is a zygote, which the double refuses.
    """

    def make(**flags: object) -> Settings:
        return load_settings(env={}, flags={"state_dir": str(state_dir), "prestart_size": 0, **flags})

    return make


# Fixtures that start real sandboxes (or the networks and engines around them), or take a tool
# from the built runtime: a test that uses one needs bwrap (or podman, docker) and `make runtime`,
# whatever folder it is in.
_REAL_SANDBOX_FIXTURES = frozenset(
    {
        "bwrap_probe",  # tests/engine
        "make_engine",
        "running_engine",
        "backend_probes",  # tests/sandbox
        "make_sandbox",
        "container_probes",  # tests/containers
        "make_container_engine",
        "docker_engine",
        "packaged_runtime",
        "test_net",  # tests/egress
        "egress_engine",
        "typescript",  # tests/bridge/test_typings.py: tsc from `make runtime`
    }
)


# Fixtures that start a service of the tests' own (a PostgreSQL cluster, SeaweedFS, HAProxy):
# seconds each, so `make check`, the edit loop's lane, leaves their tests to `make test`.
_SERVICE_FIXTURES = frozenset({"postgres", "s3_endpoint", "own_cluster"})


# Modules whose assertions bound a run, a takeover or a pool's retirement in seconds: `make test`
# runs them after the parallel workers are done (`-m serial`), on a machine nobody else loads. A
# module where only some tests are timed marks those `@pytest.mark.serial` itself
# (tests/sandbox/test_limits.py).
_SERIAL_MODULES = frozenset(
    {
        # A frozen owner's calls are answered within six 3 s leases: a busy machine holds one longer.
        "tests/replicas/test_nemesis.py",
        # Its pool_idle of 2 s must outlast a ready sandbox's start: on a busy machine a pool is
        # retired before its first sandbox is ready, which then never becomes idle.
        "tests/engine/test_ready_by_uid.py",
    }
)
_ROOT = Path(__file__).resolve().parents[1]


def _uses_a_service(item: pytest.Item) -> bool:
    if _SERVICE_FIXTURES.intersection(getattr(item, "fixturenames", ())):
        return True
    callspec = getattr(item, "callspec", None)  # metadata_target's PostgreSQL half asks for it late
    return callspec is not None and callspec.params.get("metadata_target") == "postgresql"


@pytest.hookimpl(optionalhook=True)  # a hook of pytest-xdist
def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> CostFirstScheduling | None:
    """``--dist loadscope`` (``make test``): long modules cut, the costliest first (tests/xdist_scopes.py)."""
    from xdist_scopes import CostFirstScheduling  # needs xdist, there whenever xdist calls this

    return CostFirstScheduling(config, log) if config.getvalue("dist") == "loadscope" else None


# `make test` runs the tests marked `background` beside the serial ones, at the lowest CPU weight
# (scripts/lowest-weight.sh): the serial tests mostly wait, and these need no more than what is left.
# They are those whose every process is under that weight: the tests that need no real sandbox,
# service or e2e server (the `make check` lane), and the bwrap half of the sandbox and engine
# suites, whose sandboxes' cgroups are made below the test's own. Never a container's (podman's and
# docker's cgroups are their engines') nor a test timed in seconds.
_BACKGROUND_SANDBOX_FOLDERS = ("tests/sandbox/", "tests/engine/")
_CONTAINER_FIXTURES = frozenset({"container_probes", "make_container_engine", "docker_engine"})


def _background(item: pytest.Item, relative: str) -> bool:
    if relative.startswith("tests/e2e/") or any(
        item.get_closest_marker(name) for name in ("serial", "services", "e2e", "slow")
    ):
        return False
    if item.get_closest_marker("sandbox") is None:
        return True
    callspec = getattr(item, "callspec", None)
    backend = callspec.params.get("backend_name", "bwrap") if callspec is not None else "bwrap"
    return (
        relative.startswith(_BACKGROUND_SANDBOX_FOLDERS)
        and backend == "bwrap"
        and not _CONTAINER_FIXTURES.intersection(getattr(item, "fixturenames", ()))
    )


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects by marker
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark ``sandbox`` every test that uses a fixture starting a real sandbox, ``services`` every
    test that starts a service, ``serial`` every test of a module timed in seconds (see above),
    ``background`` every test `make test` may run beside the serial ones (see above)."""
    for item in items:
        relative = item.path.resolve().relative_to(_ROOT).as_posix()
        if relative in _SERIAL_MODULES:
            item.add_marker(pytest.mark.serial)
        if _REAL_SANDBOX_FIXTURES.intersection(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.sandbox)
        if _uses_a_service(item):
            item.add_marker(pytest.mark.services)
        if _background(item, relative):
            item.add_marker(pytest.mark.background)
