"""Resource attacks: each one ends within its bound, is reported, and leaves the host working."""

from __future__ import annotations

import os
import time
import uuid

import anyio
import pytest

from mcp_sandbox.engine.result import EXIT_TIMEOUT
from mcp_sandbox.sandbox.backends import BackendProbe

from .harness import HOST_BOUND, RunnerFactory, SandboxRunner, report_of, wait_until_gone

pytestmark = [pytest.mark.sandbox, pytest.mark.anyio]

# Marked `serial` (`make test` runs them alone, after the parallel workers): the tests that bound
# a run's end in seconds (its timeout, or its processes gone), and the fork bombs (where no pids
# cgroup is writable, RLIMIT_NPROC counts every sandbox of the uid). The memory and file limits
# hold whatever the load, so those tests run on the workers.

# How far past its timeout a killed run may take to come back (teardown, a busy 2-core host);
# MCP_SANDBOX_TEST_TIMEOUT_SLACK widens it where every process runs slower (the emulated vm-test guest).
TIMEOUT_SLACK = float(os.environ.get("MCP_SANDBOX_TEST_TIMEOUT_SLACK", "3"))


async def _host_still_works(sandbox: SandboxRunner) -> None:
    """The host can still fork, and the same engine still runs code."""
    done = await anyio.run_process(["/bin/true"])
    assert done.returncode == 0
    after = await sandbox.run("print('still here')")
    assert (after.status, after.stdout) == ("success", "still here\n")


@pytest.mark.serial
async def test_fork_bomb_ends_and_the_host_keeps_working(make_sandbox: RunnerFactory) -> None:
    sandbox = make_sandbox(pids=32)
    marker = f"fb{uuid.uuid4().hex[:12]}"  # a process name: at most 15 bytes
    started = time.monotonic()
    result = await sandbox.run(
        f"""
        _libc.prctl(15, {marker.encode()!r}, 0, 0, 0)  # PR_SET_NAME, inherited by every fork
        while True:
            try:
                os.fork()
            except OSError:
                pass
        """,
        time_limit=3,
    )
    assert result.status in {"timeout", "error"}
    assert time.monotonic() - started < 3 + TIMEOUT_SLACK
    assert await wait_until_gone(marker) == []
    await _host_still_works(sandbox)


@pytest.mark.serial
async def test_fork_bomb_hits_the_pids_limit(make_sandbox: RunnerFactory, backend_probe: BackendProbe) -> None:
    sandbox = make_sandbox(pids=32)
    result = await sandbox.run_reporting("""
        children = []
        def spawn():
            while len(children) < 1000:
                child = os.fork()
                if child == 0:
                    import time
                    time.sleep(60)
                    os._exit(0)
                children.append(child)
        report["fork"] = outcome(spawn)
        report["children"] = len(children)
        for child in children:
            os.kill(child, 9)
    """)
    report = report_of(result)
    assert report["fork"] == "BlockingIOError:EAGAIN"
    assert report["children"] < 32
    pids = {c.name: c for c in backend_probe.capabilities}.get("pids limit")
    if pids is not None and pids.enforced:  # the engine says why forks failed
        assert result.status == "error"
        assert result.error is not None and "process limit" in result.error


async def test_memory_bomb_is_killed_and_reported(make_sandbox: RunnerFactory, backend_probe: BackendProbe) -> None:
    sandbox = make_sandbox(memory="128m")
    result = await sandbox.run("""
        hog = b"\\1" * (2 << 30)  # 2 GiB, every page touched
        print("allocated", len(hog))
    """)
    assert result.status == "error"
    assert "allocated" not in result.stdout
    memory = {c.name: c for c in backend_probe.capabilities}.get("memory limit")
    if memory is not None and memory.enforced:
        assert result.error is not None and "memory" in result.error
    else:  # an address-space rlimit stands in: the allocation fails inside, and is said as the limit
        assert "MemoryError" in result.stderr
        assert result.error is not None and "memory limit of 128 MiB reached" in result.error
    await _host_still_works(sandbox)


@pytest.mark.serial
async def test_cpu_spin_times_out_within_its_bound(sandbox: SandboxRunner) -> None:
    started = time.monotonic()
    result = await sandbox.run("while True:\n    pass", time_limit=2)
    elapsed = time.monotonic() - started
    assert (result.status, result.exit_code) == ("timeout", EXIT_TIMEOUT)
    assert 2 <= elapsed < 2 + TIMEOUT_SLACK


@pytest.mark.serial
async def test_cpu_spin_in_a_child_is_killed_with_the_run(sandbox: SandboxRunner) -> None:
    marker = f"cpu{uuid.uuid4().hex[:12]}"
    result = await sandbox.run(
        f"""
        if os.fork() == 0:
            _libc.prctl(15, {marker.encode()!r}, 0, 0, 0)
            while True:
                pass
        os.wait()
        """,
        time_limit=2,
    )
    assert result.status == "timeout"
    assert await wait_until_gone(marker) == []


async def test_open_files_are_limited(make_sandbox: RunnerFactory) -> None:
    sandbox = make_sandbox(open_files=64)
    report = await sandbox.report("""
        fds = []
        def hoard():
            while len(fds) < 100_000:
                fds.append(os.open("/dev/null", os.O_RDONLY))
        report["open"] = outcome(hoard)
        report["count"] = len(fds)
        for fd in fds:
            os.close(fd)
    """)
    assert report["open"] == "OSError:EMFILE"
    assert report["count"] < 64


async def test_rlimits_cannot_be_raised(sandbox: SandboxRunner) -> None:
    report = await sandbox.report("""
        import resource
        for name in ("RLIMIT_FSIZE", "RLIMIT_NOFILE", "RLIMIT_CPU", "RLIMIT_CORE"):
            which = getattr(resource, name)
            report[name] = outcome(lambda: resource.setrlimit(which, (resource.RLIM_INFINITY, resource.RLIM_INFINITY)))
    """)
    assert report == dict.fromkeys(["RLIMIT_FSIZE", "RLIMIT_NOFILE", "RLIMIT_CPU", "RLIMIT_CORE"], "ValueError")


@pytest.mark.serial
async def test_sleeping_run_is_bounded_by_its_timeout_not_by_the_host_bound(sandbox: SandboxRunner) -> None:
    started = time.monotonic()
    result = await sandbox.run("import time\ntime.sleep(600)", time_limit=1)
    assert result.status == "timeout"
    assert time.monotonic() - started < 1 + TIMEOUT_SLACK < HOST_BOUND
