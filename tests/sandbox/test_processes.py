"""Process attacks: nothing outlives a run, and nothing inside reaches a process outside.

Processes the sandbox starts carry a unique marker in their argv; after a run the test looks
for it in the host's /proc (a bounded poll: the kernel reaps a dead namespace asynchronously).
"""

from __future__ import annotations

import os
import signal
import subprocess
import textwrap
import uuid
from functools import partial
from pathlib import Path

import anyio
import pytest

from .harness import SandboxRunner, left_in_runs, report_of, wait_until_gone, wait_until_running

pytestmark = [pytest.mark.sandbox, pytest.mark.anyio]


def _spawn_orphan(marker: str) -> str:
    """Sandboxed code: a double-forked, setsid'd ``sleep 300`` named ``marker``, seen running."""
    return textwrap.dedent(f"""
        import time
        first = os.fork()
        if first == 0:
            os.setsid()
            if os.fork() == 0:
                os.execv("/bin/sleep", [{marker!r}, "300"])
            os._exit(0)
        os.waitpid(first, 0)
        def running():
            for pid in os.listdir("/proc"):
                try:
                    if pid.isdigit() and {marker.encode()!r} in open(f"/proc/{{pid}}/cmdline", "rb").read():
                        return True
                except OSError:
                    pass
            return False
        deadline = time.monotonic() + 3
        while not running() and time.monotonic() < deadline:
            time.sleep(0.01)
        report["orphan_running"] = running()
    """)


async def test_double_forked_orphan_does_not_outlive_the_run(sandbox: SandboxRunner) -> None:
    marker = f"orphan-{uuid.uuid4().hex}"
    report = await sandbox.report(_spawn_orphan(marker))
    assert report["orphan_running"] is True  # the attack really left a process behind
    assert await wait_until_gone(marker) == []


async def test_orphan_of_a_timed_out_run_is_killed(sandbox: SandboxRunner) -> None:
    marker = f"orphan-{uuid.uuid4().hex}"
    result = await sandbox.run(_spawn_orphan(marker) + "\ntime.sleep(600)\n", time_limit=2)
    assert result.status == "timeout"
    assert await wait_until_gone(marker) == []


async def test_cancelled_execution_kills_the_sandbox(sandbox: SandboxRunner) -> None:
    marker = f"cancelled-{uuid.uuid4().hex}"
    async with anyio.create_task_group() as group:
        group.start_soon(partial(sandbox.run, _spawn_orphan(marker) + "\ntime.sleep(600)\n", time_limit=30))
        await wait_until_running(marker)
        group.cancel_scope.cancel()
    assert await wait_until_gone(marker) == []
    assert left_in_runs(sandbox.settings) == []  # its workspace went too (if it was on the host)
    after = await sandbox.run("print('next')")
    assert after.stdout == "next\n"


async def test_concurrent_sandboxes_cannot_see_or_reach_each_other(sandbox: SandboxRunner) -> None:
    marker = f"neighbour-{uuid.uuid4().hex}"
    abstract = "\0" + marker  # an abstract unix socket name: per network namespace
    # The socket is bound before the marked process starts, so it exists once the test sees it.
    neighbour = (
        textwrap.dedent(f"""
        import socket
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind({abstract!r})
        listener.listen()
    """)
        + _spawn_orphan(marker)
        + "\ntime.sleep(600)\n"
    )
    async with anyio.create_task_group() as group:
        group.start_soon(partial(sandbox.run, neighbour, time_limit=30))
        (neighbour_pid, *_) = await wait_until_running(marker)
        report = await sandbox.report(f"""
            import socket
            seen = []
            for pid in os.listdir("/proc"):
                try:
                    if pid.isdigit() and {marker.encode()!r} in open(f"/proc/{{pid}}/cmdline", "rb").read():
                        seen.append(pid)
                except OSError:
                    pass
            report["seen"] = seen
            report["kill"] = outcome(lambda: os.kill({neighbour_pid}, 9))
            def connect():
                with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
                    s.connect({abstract!r})
            report["connect"] = outcome(connect)
        """)
        assert host_alive(neighbour_pid)
        group.cancel_scope.cancel()
    assert report == {"seen": [], "kill": "ProcessLookupError:ESRCH", "connect": "ConnectionRefusedError:ECONNREFUSED"}
    assert await wait_until_gone(marker) == []


def host_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


async def test_signalling_host_processes_fails(sandbox: SandboxRunner) -> None:
    # A host process of the sandbox's own host uid is the one a shared pid namespace would expose.
    root = os.geteuid() == 0
    sleeper = await anyio.open_process(
        ["/bin/sleep", "60"],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        user=sandbox.settings.sandbox.sandbox_uid if root else None,
        group=sandbox.settings.sandbox.sandbox_gid if root else None,
        extra_groups=[] if root else None,
    )
    try:
        report = await sandbox.report(f"""
            import signal
            report["test_process"] = outcome(lambda: os.kill({os.getpid()}, signal.SIGTERM))
            report["same_uid_process"] = outcome(lambda: os.kill({sleeper.pid}, signal.SIGKILL))
            report["everyone"] = outcome(lambda: os.kill(-1, signal.SIGKILL))
        """)
        assert sleeper.returncode is None and host_alive(sleeper.pid)
    finally:
        sleeper.kill()
        with anyio.fail_after(5):
            await sleeper.wait()
    assert report["test_process"] == "ProcessLookupError:ESRCH"
    assert report["same_uid_process"] == "ProcessLookupError:ESRCH"
    # kill(-1) reaches only the sandbox's own namespace, where nothing else is running; a warm
    # sandbox's run may not send it at all (it would reach the zygote that forked the run).
    allowed = {"ok", "ProcessLookupError:ESRCH"} if not sandbox.warm else {"PermissionError:EPERM"}
    assert report["everyone"] in allowed
    assert sleeper.returncode == -signal.SIGKILL  # our kill, not the sandbox's


async def test_killing_pid_1_inside_does_not_hurt_the_host(sandbox: SandboxRunner) -> None:
    result = await sandbox.run_reporting("""
        import signal
        report["kill_init"] = outcome(lambda: os.kill(1, signal.SIGKILL))
        report["survived"] = True
    """)
    # Init of a pid namespace ignores signals from inside it; if a backend's init died instead,
    # the run ends with an error, and either way the host and the next run are fine. A warm
    # container's init is its zygote, whose guard refuses the signal outright (EPERM).
    assert result.status in {"success", "error"}
    if result.status == "success":
        container_zygote = sandbox.warm and not sandbox.engine.backend.warm_pool
        refused = "PermissionError:EPERM" if container_zygote else "ok"
        assert report_of(result) == {"kill_init": refused, "survived": True}
    after = await sandbox.run("print('next')")
    assert (after.status, after.stdout) == ("success", "next\n")
    assert host_alive(os.getpid())


def _our_cgroups(sandbox: SandboxRunner) -> list[str]:
    """Our sandboxes' cgroups (not those a running bwrap backend keeps ahead of its starts)."""
    cgroups = getattr(sandbox.engine.backend, "cgroups", None)
    if cgroups is None:
        return []
    prefix = f"mcp-sandbox-{os.getpid()}-"
    spare: frozenset[Path] = getattr(sandbox.engine.backend, "spare_cgroups", frozenset())
    bases: list[Path] = list(cgroups.bases.values())
    return [p.name for base in bases for p in base.iterdir() if p.name.startswith(prefix) and p not in spare]


async def test_no_cgroup_is_left_behind_after_runs_that_end_in_every_way(sandbox: SandboxRunner) -> None:
    # This worker's earlier tests may still be tearing a sandbox down (one such cgroup outlived six
    # of these tests once, then went): what is judged is what these runs leave.
    before = set(_our_cgroups(sandbox))
    marker = f"mcp-sandbox-cg-{uuid.uuid4().hex}"
    await sandbox.run(_spawn_orphan(marker))
    await sandbox.run("while True: pass", time_limit=1)
    await sandbox.run("import os; os.kill(os.getpid(), 9)")

    assert sorted(set(_our_cgroups(sandbox)) - before) == []
