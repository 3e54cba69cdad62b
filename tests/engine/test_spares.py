"""First processes a running bwrap backend keeps admitted ahead of its starts (``BwrapBackend.running``).

A spare is started and put in cgroups before any policy is known; the sandbox that takes it
must still get exactly its own policy's limits, and a spare must never outlive the backend.
"""

from __future__ import annotations

import logging
import os
import signal

import anyio
import pytest

from mcp_sandbox.engine import Engine
from mcp_sandbox.sandbox.backends import Sandbox, SandboxOutcome
from mcp_sandbox.sandbox.backends.bwrap.sandbox import SPARES, BwrapBackend
from mcp_sandbox.sandbox.hostfs import system_mounts
from mcp_sandbox.sandbox.policy import Limits, SandboxPolicy

from .conftest import EngineFactory
from .helpers import HOST_BOUND, own_processes, poll

pytestmark = [pytest.mark.sandbox, pytest.mark.anyio]

# The name a first process waiting at its gate carries (sandbox/launcher.py): the sh gate's $0, and
# the static gate's (run from a descriptor, it names itself; the kernel keeps 15 characters).
_GATE = "mcp-sandbox-gat"
# ~150 MB held by the shell: fits in the default 512 MiB, not in 64 MiB.
_BOMB = "x=$(head -c 150000000 /dev/zero | tr '\\0' a); echo survived"


def _policy(script: str, limits: Limits) -> SandboxPolicy:
    mounts, links = system_mounts()
    return SandboxPolicy(command=("/bin/sh", "-c", script), mounts=mounts, symlinks=links, cwd="/", limits=limits)


async def _finish(sandbox: Sandbox) -> tuple[SandboxOutcome, str]:
    with anyio.fail_after(HOST_BOUND):
        out = await sandbox.stdout.read()
        await sandbox.wait()
    return await sandbox.aclose(), out.decode()


def _backend(engine: Engine) -> BwrapBackend:
    backend = engine.backend
    assert isinstance(backend, BwrapBackend)
    if backend.cgroups.version is None or not backend.cgroups.enforces("memory"):
        pytest.skip(f"no memory cgroup here: {backend.cgroups.reason}")
    return backend


async def _spares_ready(backend: BwrapBackend) -> None:
    """Wait until the backend keeps all its spares, each admitted to its cgroups."""
    per_spare = len(set(backend.cgroups.bases.values()))
    with anyio.fail_after(HOST_BOUND):
        await poll(lambda: len(backend.spare_cgroups) == SPARES * per_spare)


async def _start_from_spare(backend: BwrapBackend, policy: SandboxPolicy) -> tuple[SandboxOutcome, str]:
    await _spares_ready(backend)
    spares = backend.spare_cgroups
    sandbox = await backend.start(policy)
    assert spares - backend.spare_cgroups  # it took one (and keeps its cgroups)
    return await _finish(sandbox)


async def test_a_sandbox_started_ahead_gets_its_own_policys_limits_not_the_spares(
    make_engine: EngineFactory, caplog: pytest.LogCaptureFixture
) -> None:
    roomy, tight = Limits(), Limits(memory=64 << 20, pids=16, open_files=77)
    backend = _backend(make_engine(pool_size=0, pool_min=0, prestart_size=0))
    async with backend.running():
        first = await _finish(await backend.start(_policy(_BOMB, roomy)))  # the spares get roomy limits
        # Two tight runs take both roomy spares (their limits lowered); the next spares are tight.
        lowered = [await _start_from_spare(backend, _policy(f"ulimit -n; {_BOMB}", tight)) for _ in range(SPARES)]
        raised = await _start_from_spare(backend, _policy(f"ulimit -n; {_BOMB}", roomy))

    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == []  # no spare failed
    assert (first[0].returncode, first[0].memory_exceeded, first[1]) == (0, False, "survived\n")
    for outcome, out in lowered:
        assert out == "77\n"  # its own open-files limit; killed at 64 MiB, not let through to 512
        assert outcome.memory_exceeded
    outcome, out = raised
    assert out == f"{roomy.open_files}\nsurvived\n"
    assert (outcome.returncode, outcome.memory_exceeded) == (0, False)


async def test_a_spare_that_died_meanwhile_is_replaced_by_a_start_of_its_own(make_engine: EngineFactory) -> None:
    backend = _backend(make_engine(pool_size=0, pool_min=0, prestart_size=0))
    async with backend.running():
        await _finish(await backend.start(_policy("true", Limits())))
        await _spares_ready(backend)
        killed = own_processes(_GATE)
        for pid in killed:
            os.kill(pid, signal.SIGKILL)
        with anyio.fail_after(HOST_BOUND):  # reaped: gone from the process table
            await poll(lambda: not any(os.path.exists(f"/proc/{pid}") for pid in killed))
        outcome, out = await _finish(await backend.start(_policy("echo started", Limits())))

    assert len(killed) == SPARES
    assert (outcome.returncode, out) == (0, "started\n")


async def test_leaving_a_running_backend_ends_its_spares_and_removes_their_cgroups(
    make_engine: EngineFactory,
) -> None:
    backend = _backend(make_engine(pool_size=0, pool_min=0, prestart_size=0))
    async with backend.running():
        await _finish(await backend.start(_policy("true", Limits())))
        await _spares_ready(backend)
        spares = backend.spare_cgroups
        assert len(own_processes(_GATE)) == SPARES

    assert backend.spare_cgroups == frozenset()
    assert [path for path in spares if path.exists()] == []
    with anyio.fail_after(HOST_BOUND):
        await poll(lambda: not own_processes(_GATE))
