"""Warm sandboxes: fresh state per run from a forked zygote, the pool's life, admission control."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import AsyncIterator
from typing import Any

import anyio
import pytest

from mcp_sandbox.engine import Engine
from mcp_sandbox.errors import BusyError

from .conftest import RunningEngine
from .helpers import execute, own_processes, poll, spawn_marked, wait_until_gone

pytestmark = [pytest.mark.sandbox, pytest.mark.anyio]

# Each test's pool: one warm sandbox, nothing preloaded (fast), unless the test says otherwise.
_POOL: dict[str, Any] = {"pool_size": 1, "pool_min": 1, "pool_preload": ""}


@contextlib.asynccontextmanager
async def warm_engine(running_engine: RunningEngine, **flags: Any) -> AsyncIterator[Engine]:
    """A running engine whose pool has a warm sandbox ready."""
    async with running_engine(**{**_POOL, **flags}) as engine:
        await wait_warm(engine)
        yield engine


async def wait_warm(engine: Engine, count: int = 1) -> None:
    with anyio.fail_after(60):
        await poll(lambda: engine.pool.idle >= count)


async def warm_run(engine: Engine, code: str, **fields: Any) -> Any:
    """Run ``code`` in the pool's warm sandbox (waiting for it to be ready first)."""
    await wait_warm(engine)
    result = await execute(engine, code, **fields)
    assert result.warm, "the run did not go to a warm sandbox"
    return result


# (what one run leaves behind, what the next run prints when it sees none of it)
LEAKS = {
    "globals": ("secret = 42", "print('secret' in globals())", "False"),
    "modules": (
        "import string; string.digits = 'patched'",
        "import string; print(string.digits)",
        "0123456789",
    ),
    "sys.modules": (
        "import sys, types; sys.modules['planted'] = types.ModuleType('planted')",
        "import sys; print('planted' in sys.modules)",
        "False",
    ),
    # By name: /tmp also holds the mount point of a runtime that lives under the host's /tmp.
    "tmp": (
        "import os; os.makedirs('/tmp/d'); open('/tmp/left', 'w').write('x')",
        "import os; print(os.path.exists('/tmp/left'), os.path.exists('/tmp/d'))",
        "False False",
    ),
    "dev-shm": ("open('/dev/shm/left', 'w').write('x')", "import os; print(os.listdir('/dev/shm'))", "[]"),
    "workspace": (
        "import os; os.makedirs('/workspace/d/e')\n"
        "open('/workspace/d/e/f', 'w').write('x')\n"
        "os.chmod('/workspace/d', 0)",
        "import os; print(os.listdir('/workspace'))",
        "[]",
    ),
    "signal handlers": (
        "import signal; signal.signal(signal.SIGTERM, signal.SIG_IGN)",
        "import signal; print(signal.getsignal(signal.SIGTERM) is signal.SIG_DFL)",
        "True",
    ),
    "environment": ("import os; os.environ['LEFT'] = '1'", "import os; print(os.environ.get('LEFT'))", "None"),
    "cwd and umask": (
        "import os; os.chdir('/tmp'); os.umask(0o777)",
        "import os; print(os.getcwd(), oct(os.umask(0o22)))",
        "/workspace 0o22",
    ),
    "System V shared memory": (
        "import ctypes; libc = ctypes.CDLL(None); assert libc.shmget(1234, 4096, 0o1600) >= 0",
        "print(open('/proc/sysvipc/shm').read().splitlines()[1:])",
        "[]",
    ),
}


@pytest.mark.parametrize("name", sorted(LEAKS))
async def test_nothing_of_one_run_reaches_the_next(running_engine: RunningEngine, name: str) -> None:
    leave, look, clean = LEAKS[name]
    async with warm_engine(running_engine) as engine:
        first = await warm_run(engine, leave)
        second = await warm_run(engine, look)

    assert first.status == "success", first.stderr
    assert (second.status, second.stdout.strip()) == ("success", clean), second.stderr


async def test_one_warm_sandbox_serves_run_after_run(running_engine: RunningEngine) -> None:
    async with warm_engine(running_engine) as engine:
        for _ in range(3):
            result = await warm_run(engine, "open('/tmp/scratch', 'w').write('x')")
            assert result.status == "success", result.stderr
        warm = await engine.pool.take()
        assert warm is not None and warm.runs == 3  # restored each time, never replaced
        engine.pool.give_back(warm, reusable=True)


async def test_processes_a_run_leaves_behind_are_killed_before_the_next(running_engine: RunningEngine) -> None:
    marker = f"warm-orphan-{uuid.uuid4().hex}"
    daemon = spawn_marked(marker) + "\nimport os\nif os.fork() == 0:\n    os.setsid()\n    time.sleep(300)\n"
    async with warm_engine(running_engine) as engine:
        first = await warm_run(engine, daemon)
        assert await wait_until_gone(marker) == []
        second = await warm_run(engine, "import os; print(sorted(int(p) for p in os.listdir('/proc') if p.isdigit()))")

    assert first.status == "success", first.stderr
    # bwrap's init, the zygote and the run itself: nothing the first run started.
    assert second.status == "success" and len(eval(second.stdout)) == 3, second.stdout


async def test_the_random_generators_differ_between_runs(running_engine: RunningEngine) -> None:
    code = "import random, numpy; print(random.random(), numpy.random.random())"
    async with warm_engine(running_engine, pool_preload="numpy") as engine:
        first = await warm_run(engine, code)
        second = await warm_run(engine, code)

    first_values, second_values = first.stdout.split(), second.stdout.split()
    assert first_values[0] != second_values[0] and first_values[1] != second_values[1]


async def test_the_default_preload_is_imported_before_the_run(running_engine: RunningEngine) -> None:
    async with running_engine(pool_size=1, pool_min=1) as engine:  # no pool_preload: the default's
        preload = engine.settings.pool.pool_preload
        result = await warm_run(engine, f"import sys; print([m in sys.modules for m in {list(preload)!r}])")

    assert preload == ("numpy", "pandas")
    assert result.stdout == "[True, True]\n"


async def test_a_preloading_zygote_has_exercised_its_modules_before_the_run(running_engine: RunningEngine) -> None:
    # What the first repr of a DataFrame imports; and every exercise runs as written (the zygote skips a failing one).
    code = (
        "import sys\n"
        "from mcp_sandbox_runtime import preload\n"
        "print('pandas.io.formats.string' in sys.modules)\n"
        "for exercise in preload._EXERCISES.values():\n"
        "    exec(exercise, {})\n"
        "print(sorted(preload._EXERCISES))"
    )
    async with warm_engine(running_engine, pool_preload="numpy,pandas") as engine:
        result = await warm_run(engine, code)

    assert (result.status, result.stdout) == ("success", "True\n['numpy', 'pandas']\n"), result.stderr


async def test_a_run_cannot_signal_its_zygote_or_join_its_process_group(running_engine: RunningEngine) -> None:
    attack = """
        import ctypes, os, signal
        zygote = os.getppid()
        results = {}
        for name, call in {
            "kill": lambda: os.kill(zygote, signal.SIGKILL),
            "stop": lambda: os.kill(zygote, signal.SIGSTOP),
            "group": lambda: os.killpg(zygote, signal.SIGKILL),
            "everyone": lambda: os.kill(-1, signal.SIGKILL),
            "join": lambda: os.setpgid(0, zygote),
            "pidfd": lambda: os.pidfd_open(zygote),
        }.items():
            try:
                call()
                results[name] = "ok"
            except OSError as error:
                results[name] = error.errno
        libc = ctypes.CDLL(None, use_errno=True)
        # kill(2) with garbage above the 32 bits of the pid: the kernel still reads the pid.
        results["raw"] = libc.syscall(62, ctypes.c_long((1 << 32) | zygote), 9)
        print(results)
    """
    async with warm_engine(running_engine) as engine:
        # The first run's child installs the guard its EXEC brings; the children forked after it
        # install it before their EXEC comes (the zygote learned it): all are attacked.
        attacks = [await warm_run(engine, attack) for _ in range(3)]
        last = await warm_run(engine, "print('still warm')")
        warm = await engine.pool.take()
        assert warm is not None and warm.runs == 4  # one zygote served them all
        engine.pool.give_back(warm, reusable=True)

    for result in attacks:
        assert result.status == "success", result.stderr
        assert eval(result.stdout) == {
            "kill": 1,
            "stop": 1,
            "group": 1,
            "everyone": 1,
            "join": 1,
            "pidfd": 1,
            "raw": -1,
        }
    assert last.stdout == "still warm\n"


async def test_a_run_cannot_write_the_zygotes_memory(running_engine: RunningEngine) -> None:
    attack = """
        import os
        try:
            open(f"/proc/{os.getppid()}/mem", "r+b")
            print("opened")
        except OSError as error:
            print(type(error).__name__)
    """
    async with warm_engine(running_engine) as engine:
        result = await warm_run(engine, attack)

    assert result.stdout == "PermissionError\n"


async def test_a_run_that_changes_the_zygotes_limits_gets_a_new_warm_sandbox(running_engine: RunningEngine) -> None:
    lower = "import os, resource; resource.prlimit(os.getppid(), resource.RLIMIT_NOFILE, (16, 16))"
    look = "import resource; print(resource.getrlimit(resource.RLIMIT_NOFILE))"
    async with warm_engine(running_engine, open_files=256) as engine:
        first = await warm_run(engine, lower)
        second = await warm_run(engine, look)

    assert first.status == "success", first.stderr
    assert second.stdout == "(256, 256)\n"


async def test_a_timed_out_warm_run_is_killed_and_the_pool_refills(running_engine: RunningEngine) -> None:
    marker = f"warm-timeout-{uuid.uuid4().hex}"
    async with warm_engine(running_engine) as engine:
        timed_out = await warm_run(engine, spawn_marked(marker) + "\ntime.sleep(600)", time_limit=2)
        assert await wait_until_gone(marker) == []
        after = await warm_run(engine, "print('again')")

    assert (timed_out.status, timed_out.exit_code) == ("timeout", 124)
    assert after.stdout == "again\n"


async def test_exit_codes_errors_and_output_match_a_fresh_sandbox(running_engine: RunningEngine) -> None:
    async with warm_engine(running_engine) as engine:
        exited = await warm_run(engine, "import sys; print('out'); sys.exit(3)")
        raised = await warm_run(engine, "raise ValueError('boom')")
        crashed = await warm_run(engine, "import os, signal; os.kill(os.getpid(), signal.SIGSEGV)")
        at_exit = await warm_run(engine, "import atexit; atexit.register(print, 'bye')")

    assert (exited.status, exited.exit_code, exited.stdout) == ("error", 3, "out\n")
    assert raised.exit_code == 1 and raised.stderr.endswith("ValueError: boom\n")
    assert crashed.exit_code == 128 + 11 and crashed.error is not None and "SIGSEGV" in crashed.error
    assert (at_exit.status, at_exit.stdout) == ("success", "bye\n")


async def test_memory_and_pids_limits_are_reported_per_run(running_engine: RunningEngine) -> None:
    hog = "b = bytearray(400 << 20)\nfor i in range(0, len(b), 4096): b[i] = 1"
    bomb = """
        import os, time
        for _ in range(200):
            try:
                os.fork() or time.sleep(30)
            except OSError:
                break
    """
    async with warm_engine(running_engine, memory="256m", pids=32) as engine:
        oom = await warm_run(engine, hog)
        forks = await warm_run(engine, bomb)
        await wait_warm(engine)
        fine = await warm_run(engine, "print(1)")

    assert oom.status == "error" and oom.error is not None and "memory limit" in oom.error
    assert forks.error is not None and "process limit of 32 reached" in forks.error
    assert (fine.status, fine.error) == ("success", None)


async def test_the_pool_grows_to_its_size_and_shrinks_when_idle(running_engine: RunningEngine) -> None:
    async with running_engine(pool_size=3, pool_min=1, pool_preload="", pool_idle="1s") as engine:
        await wait_warm(engine)
        sizes: list[int] = []

        async def watch() -> None:  # the grown sandboxes may be idle for pool_idle before the runs end
            while True:
                sizes.append(engine.pool.size)
                await anyio.sleep(0.01)

        async with anyio.create_task_group() as watching:
            watching.start_soon(watch)
            async with anyio.create_task_group() as runs:
                for _ in range(3):
                    runs.start_soon(execute, engine, "import time; time.sleep(1)")
            with anyio.fail_after(60):
                await poll(lambda: max(sizes) >= 2)  # the runs that found none idle made it grow
                await poll(lambda: engine.pool.size == 1)  # and what grew stopped once idle
            watching.cancel_scope.cancel()


async def test_runs_past_the_queue_are_refused_busy(running_engine: RunningEngine) -> None:
    flags = {"max_concurrent_runs": 1, "max_queued_runs": 1, "queue_timeout": "30s"}
    async with running_engine(**_POOL, **flags) as engine:
        results: list[Any] = []

        async def run(code: str) -> None:
            try:
                results.append(await execute(engine, code))
            except BusyError as error:
                results.append(error)

        async with anyio.create_task_group() as runs:
            runs.start_soon(run, "import time; time.sleep(2)")
            await anyio.sleep(0.3)
            runs.start_soon(run, "print('queued')")
            await anyio.sleep(0.3)
            runs.start_soon(run, "print('refused')")

    refused = [r for r in results if isinstance(r, BusyError)]
    ran = [r.stdout for r in results if not isinstance(r, BusyError)]
    assert len(refused) == 1 and "waiting" in str(refused[0])
    assert sorted(ran) == ["", "queued\n"]


async def test_a_run_waits_at_most_queue_timeout_for_a_slot(running_engine: RunningEngine) -> None:
    async with running_engine(**_POOL, max_concurrent_runs=1, queue_timeout="1s") as engine:
        async with anyio.create_task_group() as runs:
            runs.start_soon(execute, engine, "import time; time.sleep(3)")
            await anyio.sleep(0.3)
            with pytest.raises(BusyError):
                await execute(engine, "print(1)")


async def test_without_a_running_engine_runs_start_sandboxes_of_their_own(make_engine: Any) -> None:
    result = await execute(make_engine(**_POOL), "print(1)")
    assert (result.stdout, result.warm) == ("1\n", False)
    assert own_processes("--zygote") == []


async def test_warm_runs_see_the_stubs_and_call_the_tools_of_their_own_servers(running_engine: RunningEngine) -> None:
    from .test_tools_view import stubs

    call = "import os\nprint(sorted(os.listdir('/tools')), mcp_{alias}.{tool}_sync())"
    async with warm_engine(running_engine) as engine:
        first_access = stubs(engine, alpha=["ping"])
        first = await warm_run(engine, call.format(alias="alpha", tool="ping"), tools=first_access)
        second_access = stubs(engine, beta=["pong"])
        second = await warm_run(engine, call.format(alias="beta", tool="pong"), tools=second_access)

    assert first.stdout == "['alpha'] {'server': 'alpha', 'tool': 'ping'}\n", first.stderr
    assert second.stdout == "['beta'] {'server': 'beta', 'tool': 'pong'}\n", second.stderr


async def test_a_run_cannot_signal_its_zygote_through_a_proc_directory_descriptor(
    running_engine: RunningEngine,
) -> None:
    # Issue 21, finding 10: a directory fd of /proc/<pid> is a pidfd; pidfd_send_signal on it
    # killed the zygote.
    attack = """
        import ctypes, os, signal
        fd = os.open(f"/proc/{os.getppid()}", os.O_RDONLY | os.O_DIRECTORY)
        libc = ctypes.CDLL(None, use_errno=True)
        done = libc.syscall(424, fd, signal.SIGKILL, None, 0)  # pidfd_send_signal
        print(done, ctypes.get_errno())
    """
    async with warm_engine(running_engine) as engine:
        first = await warm_run(engine, attack)
        second = await warm_run(engine, "print('still warm')")
        warm = await engine.pool.take()
        assert warm is not None and warm.runs == 2  # the same zygote served both
        engine.pool.give_back(warm, reusable=True)

    assert first.stdout.split() == ["-1", "1"], first.stderr  # EPERM
    assert second.stdout == "still warm\n"


# What one run tries on the zygote or the sandbox, and what the next run must see (a fresh sandbox's state).
_SCHEDULING_ATTACK = """
    import ctypes, os
    zygote = os.getppid()
    libc = ctypes.CDLL(None, use_errno=True)
    tried = {}
    def attempt(name, call):
        try:
            tried[name] = call()
        except OSError as error:
            tried[name] = error.errno
    attempt("sched_idle", lambda: os.sched_setscheduler(zygote, os.SCHED_IDLE, os.sched_param(0)))
    attempt("batch", lambda: os.sched_setscheduler(zygote, os.SCHED_BATCH, os.sched_param(0)))
    attempt("nice", lambda: os.setpriority(os.PRIO_PROCESS, zygote, 19))
    attempt("nice_user", lambda: os.setpriority(os.PRIO_USER, 0, 19))
    attempt("nice_group", lambda: os.setpriority(os.PRIO_PGRP, os.getpgid(zygote), 19))
    idle = (3 << 13) | 0  # IOPRIO_CLASS_IDLE
    def ioprio_set(which, who):
        return ctypes.get_errno() if libc.syscall(251, which, who, idle) == -1 else 0
    attempt("ioprio", lambda: ioprio_set(1, zygote))
    attempt("ioprio_user", lambda: ioprio_set(3, 0))
    # Its own are its own (and end with it).
    os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
    for directory in ("/tmp", "/dev/shm", "/workspace"):
        os.setxattr(directory, "user.note", b"for the next tenant")
        os.chmod(directory, 0o777)
    import fcntl
    for fd in (0, 1, 2):
        fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) | os.O_NONBLOCK)
        try:
            fcntl.fcntl(fd, 1031, 4096)  # F_SETPIPE_SZ
        except OSError:
            pass
    print(tried)
"""
_FRESH_STATE = """
    import ctypes, fcntl, os, stat
    libc = ctypes.CDLL(None, use_errno=True)
    seen = {
        "policy": os.sched_getscheduler(0),
        "nice": os.getpriority(os.PRIO_PROCESS, 0),
        "ioprio": libc.syscall(252, 1, 0),
        "xattrs": [os.listxattr(d) for d in ("/tmp", "/dev/shm", "/workspace")],
        "modes": [oct(stat.S_IMODE(os.stat(d).st_mode)) for d in ("/tmp", "/dev/shm", "/workspace")],
        "nonblocking": [bool(fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_NONBLOCK) for fd in (0, 1, 2)],
        "pipe_sizes": [fcntl.fcntl(fd, 1032) if stat.S_ISFIFO(os.fstat(fd).st_mode) else None for fd in (0, 1, 2)],
        "fds": sorted(int(fd) for fd in os.listdir("/proc/self/fd")),
    }
    print(seen)
"""


async def test_a_run_leaves_no_scheduling_xattrs_modes_or_descriptor_state_to_the_next(
    running_engine: RunningEngine,
) -> None:
    # Issue 21, finding 9: the next tenant's runs inherited SCHED_IDLE, an idle I/O class, user
    # xattrs, directory modes and descriptor flags set by one run.
    async with warm_engine(running_engine) as engine:
        fresh = await warm_run(engine, _FRESH_STATE)
        attack = await warm_run(engine, _SCHEDULING_ATTACK)
        after = await warm_run(engine, _FRESH_STATE)
        warm = await engine.pool.take()
        assert warm is not None and warm.runs == 3  # one zygote: restored, not replaced
        engine.pool.give_back(warm, reusable=True)

    assert attack.status == "success", attack.stderr
    eperm = 1
    assert eval(attack.stdout) == {
        "sched_idle": eperm, "batch": eperm, "nice": eperm, "nice_user": eperm, "nice_group": eperm,
        "ioprio": eperm, "ioprio_user": eperm,
    }  # fmt: skip
    assert fresh.status == after.status == "success", after.stderr
    assert eval(after.stdout) == eval(fresh.stdout)
    assert eval(fresh.stdout)["xattrs"] == [[], [], []]


_IMPORT_STATE = """
    import sys
    finders = [sys.path_importer_cache.get(entry) for entry in sys.path]
    listed = [finder._path_mtime != -1 for finder in finders if hasattr(finder, "_path_mtime")]
    print(sys.path[-1], bool(listed) and all(listed))
"""


async def test_a_warm_run_finds_the_workspace_packages_with_its_zygotes_import_caches(
    running_engine: RunningEngine,
) -> None:
    # The child puts the workspace's packages on sys.path, as every run does, but keeps the import
    # caches the zygote filled: forgetting them made the run's imports list each directory again.
    async with warm_engine(running_engine) as engine:
        result = await warm_run(engine, _IMPORT_STATE)

    assert result.status == "success", result.stderr
    assert result.stdout.split() == ["/workspace/.packages/python", "True"]


async def test_a_run_that_hides_its_exit_status_from_the_zygote_still_gets_its_own(
    running_engine: RunningEngine,
) -> None:
    # The zygote reads a run's exit status from the kernel as the child starts to exit; a child
    # that made itself not dumpable hides it from the zygote's uid, which must then wait for it.
    hide = "import ctypes, sys\nassert ctypes.CDLL(None).prctl(4, 0, 0, 0, 0) == 0\nsys.exit(3)"
    async with warm_engine(running_engine) as engine:
        hidden = await warm_run(engine, hide)
        plain = await warm_run(engine, "import sys; sys.exit(5)")
        killed = await warm_run(engine, "import os, signal; os.kill(os.getpid(), signal.SIGTERM)")

    assert (hidden.status, hidden.exit_code) == ("error", 3), hidden.stderr
    assert (plain.status, plain.exit_code) == ("error", 5), plain.stderr
    assert (killed.status, killed.exit_code) == ("error", 128 + 15), killed.stderr


async def test_a_warm_runs_child_lowers_its_own_file_size_limit_before_the_code_runs(
    running_engine: RunningEngine,
) -> None:
    # The zygote keeps max_file_size; the child of each run takes the run's own limit (here the
    # scratch workspace's size) as its hard limit, which the code cannot raise again.
    code = """
        import resource
        print(*resource.getrlimit(resource.RLIMIT_FSIZE))
        try:
            resource.setrlimit(resource.RLIMIT_FSIZE, (64 << 20, 64 << 20))
        except (ValueError, OSError) as error:
            print(type(error).__name__)
    """
    async with running_engine(pool_size=1, scratch_size="8m", max_file_size="64m") as engine:
        result = await warm_run(engine, code)
    assert result.stdout == f"{8 << 20} {8 << 20}\nValueError\n", result.error


# Code that looks for numpy without naming it: it takes a light sandbox.
_SEES_NUMPY = "import sys; print(('num' + 'py') in sys.modules)"


async def test_runs_that_name_no_preloaded_module_take_a_light_sandbox(running_engine: RunningEngine) -> None:
    async with warm_engine(running_engine, pool_size=2, pool_min=2, pool_preload="numpy") as engine:
        await wait_warm(engine, 2)
        light = await warm_run(engine, _SEES_NUMPY)
        preloaded = await warm_run(engine, "import sys; print('numpy' in sys.modules)")
        computed = await warm_run(engine, "import importlib; print(importlib.import_module('num' + 'py').pi > 3)")

    assert (light.status, light.stdout) == ("success", "False\n"), light.stderr
    assert (preloaded.status, preloaded.stdout) == ("success", "True\n"), preloaded.stderr
    assert (computed.status, computed.stdout) == ("success", "True\n"), computed.stderr  # imported, only slower


async def test_a_light_run_takes_a_preloading_sandbox_when_no_light_one_is_idle(running_engine: RunningEngine) -> None:
    async with warm_engine(running_engine, pool_size=1, pool_min=1, pool_preload="numpy") as engine:
        result = await warm_run(engine, _SEES_NUMPY)

    assert (result.status, result.stdout) == ("success", "True\n"), result.stderr


async def test_a_full_pool_retires_an_idle_light_sandbox_for_a_preloading_one(running_engine: RunningEngine) -> None:
    async with warm_engine(running_engine, pool_size=2, pool_min=2, pool_preload="numpy") as engine:
        await wait_warm(engine, 2)
        # The preloading sandbox is busy: the next numpy run finds only the light one idle.
        async with anyio.create_task_group() as runs:
            runs.start_soon(warm_run, engine, "import numpy, time; time.sleep(1)")
            await poll(lambda: engine.pool.idle == 1)
            await execute(engine, "import numpy")  # a sandbox of its own; the light one is replaced
        await wait_warm(engine, 2)
        async with anyio.create_task_group() as runs:
            results: list[Any] = []

            async def numpy_run() -> None:
                results.append(
                    await warm_run(engine, "import sys, time; time.sleep(0.5); print('numpy' in sys.modules)")
                )

            for _ in range(2):
                runs.start_soon(numpy_run)
        assert engine.pool.size == 2

    assert [(r.status, r.stdout) for r in results] == [("success", "True\n")] * 2


async def test_a_full_pool_of_preloading_sandboxes_retires_one_for_a_light_one(running_engine: RunningEngine) -> None:
    async with warm_engine(running_engine, pool_size=2, pool_min=1, pool_preload="numpy") as engine:
        # Two numpy runs at once: the pool grows a second preloading sandbox and is full.
        async with anyio.create_task_group() as runs:
            for _ in range(2):
                runs.start_soon(execute, engine, "import numpy, time; time.sleep(0.5)")
        await wait_warm(engine, 2)
        first = await warm_run(engine, _SEES_NUMPY)  # takes a preloading one; the other is replaced
        seen = [first.stdout]
        with anyio.fail_after(60):
            while seen[-1] != "False\n":
                await anyio.sleep(0.2)
                seen.append((await warm_run(engine, _SEES_NUMPY)).stdout)
        assert engine.pool.size == 2
        numpy_run = await warm_run(engine, "import sys; print('numpy' in sys.modules)")

    assert first.stdout == "True\n"  # no light sandbox yet: the idle preloading one served it
    assert numpy_run.stdout == "True\n"  # the last preloading sandbox stays


async def test_shrinking_keeps_the_last_preloading_sandbox(running_engine: RunningEngine) -> None:
    flags = {"pool_size": 2, "pool_min": 1, "pool_preload": "numpy", "pool_idle": "1s"}
    async with warm_engine(running_engine, **flags) as engine:
        # Two light runs at once: one takes the preloading sandbox, the other makes the pool grow a light one.
        async with anyio.create_task_group() as runs:
            for _ in range(2):
                runs.start_soon(execute, engine, "import time; time.sleep(0.5)")
        await wait_warm(engine, 2)
        light = await warm_run(engine, _SEES_NUMPY)  # the light one is now the most recently used
        with anyio.fail_after(30):
            await poll(lambda: engine.pool.size == 1)
        preloaded = await warm_run(engine, "import sys; print('numpy' in sys.modules)")

    assert (light.status, light.stdout) == ("success", "False\n"), light.stderr
    assert (preloaded.status, preloaded.stdout) == ("success", "True\n"), preloaded.stderr
