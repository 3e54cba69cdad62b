"""Stateful sessions on the real bwrap backend: what is kept between runs, what is not, and how they end."""

from __future__ import annotations

import os
import signal
import uuid
from pathlib import Path

import anyio
import pytest

from mcp_sandbox.engine import ExecutionResult

from .conftest import EngineFactory, RunningEngine
from .helpers import HOST_BOUND, execute, host_processes, our_cgroups, poll, spawn_marked, wait_until_gone

pytestmark = [pytest.mark.sandbox, pytest.mark.anyio]


def _ok(result: ExecutionResult) -> ExecutionResult:
    assert result.status == "success", f"{result.status}: {result.error}\n{result.stderr}"
    return result


async def test_variables_and_imports_are_kept_between_runs_of_a_session(running_engine: RunningEngine) -> None:
    async with running_engine() as engine:
        first = _ok(await execute(engine, "import json\ncounter = 41", session="s"))
        second = _ok(await execute(engine, "counter += 1\nprint(json.dumps({'counter': counter}))", session="s"))

    assert (first.session, second.session) == ("new", "kept")
    assert second.stdout == '{"counter": 42}\n'
    assert second.structured()["session"] == "kept"


async def test_sessions_with_different_keys_do_not_share_variables(running_engine: RunningEngine) -> None:
    async with running_engine() as engine:
        await execute(engine, "secret = 'a'", session="a")
        other = await execute(engine, "print(secret)", session="b")

    assert (other.session, other.status, other.exit_code) == ("new", "error", 1)
    assert "NameError" in other.stderr


async def test_a_run_without_a_session_is_fresh_and_says_nothing_about_sessions(running_engine: RunningEngine) -> None:
    async with running_engine() as engine:
        await execute(engine, "kept = 1", session="s")
        fresh = await execute(engine, "print(kept)")

    assert (fresh.session, fresh.exit_code) == (None, 1)
    assert "session" not in fresh.structured()


async def test_with_sessions_switched_off_every_run_is_fresh(running_engine: RunningEngine) -> None:
    async with running_engine(sessions=False) as engine:
        await execute(engine, "kept = 1", session="s")
        second = await execute(engine, "print(kept)", session="s")

    assert (second.session, second.exit_code) == (None, 1)
    assert engine.live_sessions() == set()


async def test_reset_starts_a_fresh_namespace(running_engine: RunningEngine) -> None:
    async with running_engine() as engine:
        await execute(engine, "kept = 1", session="s")
        reset = await execute(engine, "print('kept' in globals())", session="s", reset=True)

    assert (reset.session, reset.stdout) == ("new", "False\n")


async def test_each_run_reports_its_exit_code_and_the_session_goes_on(running_engine: RunningEngine) -> None:
    async with running_engine() as engine:
        runs = [
            await execute(engine, code, session="s")
            for code in ("x = 1\nimport sys\nsys.exit(3)", "x += 1\nraise ValueError('boom')", "print(x)")
        ]

    assert [(run.status, run.exit_code, run.session) for run in runs] == [
        ("error", 3, "new"),
        ("error", 1, "kept"),
        ("success", 0, "kept"),
    ]
    assert runs[1].error is None  # the code failed, not the interpreter
    assert runs[2].stdout == "2\n"


async def test_stdout_of_a_run_never_contains_an_earlier_runs_output(running_engine: RunningEngine) -> None:
    async with running_engine() as engine:
        first = await execute(
            engine, "import sys\nsys.stdout.write('one, unflushed')\nprint('e1', file=sys.stderr)", session="s"
        )
        second = await execute(engine, "print('two')", session="s")

    assert (first.stdout, first.stderr) == ("one, unflushed", "e1\n")
    assert (second.stdout, second.stderr) == ("two\n", "")


async def test_top_level_await_and_loop_bound_objects_survive_between_runs(running_engine: RunningEngine) -> None:
    async with running_engine() as engine:
        await execute(engine, "import asyncio\nqueue = asyncio.Queue()\nawait queue.put('kept')", session="s")
        second = await execute(engine, "print(await queue.get())", session="s")

    assert second.stdout == "kept\n"


async def test_a_sessions_scratch_workspace_lasts_as_long_as_the_session(
    running_engine: RunningEngine, state_dir: Path
) -> None:
    async with running_engine() as engine:
        await execute(engine, "open('/workspace/note.txt', 'w').write('hello')", session="s")
        second = await execute(engine, "print(open('/workspace/note.txt').read())", session="s")
    assert second.stdout == "hello\n"
    assert os.listdir(state_dir / "runs") == []  # workspace and /tools view went with the session


async def test_a_session_keeps_its_workspace_and_another_workspace_restarts_it(
    running_engine: RunningEngine, state_dir: Path
) -> None:
    async with running_engine() as engine:
        workspace = state_dir / "conversation"
        workspace.mkdir(mode=0o700)
        if os.geteuid() == 0:
            os.chown(workspace, engine.settings.sandbox.sandbox_uid, engine.settings.sandbox.sandbox_gid)
        first = _ok(
            await execute(engine, "open('/workspace/kept.txt', 'w').write('x')", session="s", workspace=workspace)
        )
        second = _ok(
            await execute(engine, "import os\nprint(os.listdir('/workspace'))", session="s", workspace=workspace)
        )
        elsewhere = _ok(await execute(engine, "import os\nprint(os.listdir('/workspace'))", session="s"))

    assert (first.session, second.session, second.stdout) == ("new", "kept", "['kept.txt']\n")
    assert (elsewhere.session, elsewhere.stdout) == ("new", "[]\n")
    assert (workspace / "kept.txt").read_text() == "x"


@pytest.mark.parametrize(
    ("code", "signal_name"),
    [
        pytest.param("import os\nos._exit(5)", None, id="os-exit"),
        pytest.param("import os, signal\nos.kill(os.getpid(), signal.SIGKILL)", "SIGKILL", id="sigkill"),
        pytest.param("import ctypes\nctypes.string_at(0)", "SIGSEGV", id="segfault"),
    ],
)
async def test_a_dead_interpreter_is_reported_and_the_next_run_starts_fresh(
    running_engine: RunningEngine, code: str, signal_name: str | None
) -> None:
    async with running_engine() as engine:
        await execute(engine, "kept = 1", session="s")
        died = await execute(engine, code, session="s")
        after = await execute(engine, "print('kept' in globals())", session="s")

    assert (died.status, died.session) == ("error", "kept")
    assert died.error is not None and "state is lost" in died.error
    if signal_name is not None:
        assert signal_name in died.error
        assert died.exit_code == 128 + signal.Signals[signal_name]
    else:
        assert died.exit_code == 5
    assert (after.status, after.session, after.stdout) == ("success", "new", "False\n")


async def test_a_timeout_kills_the_sessions_whole_sandbox_and_the_next_run_starts_fresh(
    running_engine: RunningEngine,
) -> None:
    marker = f"session-timeout-{uuid.uuid4().hex}"
    # No warm or session-ready sandbox's cgroup either.
    async with running_engine(pool_size=0, pool_min=0, session_ready=0) as engine:
        await execute(engine, "kept = 1", session="s")
        timed_out = await execute(engine, spawn_marked(marker) + "\ntime.sleep(600)\n", session="s", time_limit=2)
        assert await wait_until_gone(marker) == []
        # The session's owner removes its cgroups once its sandbox has exited, after the answer.
        with anyio.move_on_after(HOST_BOUND):
            await poll(lambda: not our_cgroups(engine))
        assert our_cgroups(engine) == []
        after = await execute(engine, "print('kept' in globals())", session="s")

    assert (timed_out.status, timed_out.exit_code, timed_out.session) == ("timeout", 124, "kept")
    assert timed_out.error is not None and "state is lost" in timed_out.error
    assert (after.session, after.stdout) == ("new", "False\n")


async def test_a_run_in_a_session_outside_a_running_engine_is_refused(make_engine: EngineFactory) -> None:
    engine = make_engine()
    with pytest.raises(RuntimeError):
        await execute(engine, "print(1)", session="s")
    fresh = await execute(engine, "print(1)")  # runs without a session still work
    assert fresh.stdout == "1\n"


async def test_end_session_stops_it_and_says_whether_there_was_one(running_engine: RunningEngine) -> None:
    marker = f"session-end-{uuid.uuid4().hex}"
    async with running_engine() as engine:
        await execute(engine, spawn_marked(marker) + "\nkept = 1", session="s")
        assert engine.live_sessions() == {"s"}
        assert await engine.end_session("s") is True
        assert await engine.end_session("s") is False
        assert await engine.end_session("never") is False
        assert await wait_until_gone(marker) == []
        after = await execute(engine, "print('kept' in globals())", session="s")

    assert (after.session, after.stdout) == ("new", "False\n")


async def test_ending_a_session_mid_run_fails_that_run(running_engine: RunningEngine) -> None:
    marker = f"session-mid-run-{uuid.uuid4().hex}"
    results: list[ExecutionResult] = []
    async with running_engine() as engine, anyio.create_task_group() as group:

        async def long_run() -> None:
            results.append(await execute(engine, spawn_marked(marker) + "\ntime.sleep(600)", session="s"))

        group.start_soon(long_run)
        with anyio.fail_after(HOST_BOUND):
            await poll(lambda: bool(host_processes(marker)))  # the run is in the interpreter
        assert await engine.end_session("s") is True

    (ended,) = results
    assert (ended.status, ended.session) == ("error", "new")
    assert ended.error is not None and "ended" in ended.error
    assert await wait_until_gone(marker) == []


async def test_leaving_running_closes_every_session_and_leaves_no_process(running_engine: RunningEngine) -> None:
    markers = [f"session-close-{uuid.uuid4().hex}" for _ in range(2)]
    async with running_engine() as engine:
        for key, marker in zip("ab", markers, strict=True):
            _ok(await execute(engine, spawn_marked(marker), session=key))
        assert engine.live_sessions() == {"a", "b"}
    for marker in markers:
        assert await wait_until_gone(marker) == []
    assert our_cgroups(engine) == []
    assert engine.live_sessions() == set()


async def test_concurrent_runs_in_one_session_run_one_after_the_other(running_engine: RunningEngine) -> None:
    step = "import time\nlog.append(('start', {n}))\ntime.sleep(0.3)\nlog.append(('end', {n}))"
    async with running_engine() as engine:
        await execute(engine, "log = []", session="s")
        results: list[ExecutionResult] = []

        async def run(n: int) -> None:
            results.append(await execute(engine, step.format(n=n), session="s"))

        async with anyio.create_task_group() as group:
            group.start_soon(run, 1)
            group.start_soon(run, 2)
        log = await execute(engine, "print(log)", session="s")

    assert [result.status for result in results] == ["success", "success"]
    entries = eval(log.stdout)
    first, second = entries[0][1], entries[2][1]
    assert entries == [("start", first), ("end", first), ("start", second), ("end", second)]
    assert {first, second} == {1, 2}


async def test_a_second_run_waiting_for_the_first_counts_the_wait_in_its_own_timeout(
    running_engine: RunningEngine,
) -> None:
    async with running_engine() as engine:
        results: dict[str, ExecutionResult] = {}

        async def run(name: str, code: str, time_limit: float) -> None:
            results[name] = await execute(engine, code, session="s", time_limit=time_limit)

        async with anyio.create_task_group() as group:
            group.start_soon(run, "long", "import time\ntime.sleep(3)\nkept = 1", 20.0)
            with anyio.fail_after(HOST_BOUND):
                await poll(lambda: engine.busy() == {"s"})
            group.start_soon(run, "waiting", "print('ran')", 1.0)
        after = await execute(engine, "print(kept)", session="s")

    assert (results["waiting"].status, results["waiting"].stdout) == ("timeout", "")
    assert results["long"].status == "success"
    assert after.stdout == "1\n"  # waiting out its timeout did not kill the session


GARBAGE = """
import os, stat
def is_socket(fd):
    try:
        return stat.S_ISSOCK(os.fstat(fd).st_mode)
    except OSError:
        return False
for fd in [int(fd) for fd in os.listdir("/proc/self/fd") if is_socket(int(fd))]:
    os.write(fd, b"\\xff" * 4096)
print("attacked", flush=True)
"""


async def test_garbage_on_the_channel_ends_the_session_not_the_host(running_engine: RunningEngine) -> None:
    async with running_engine() as engine:
        await execute(engine, "kept = 1", session="s")
        attacked = await execute(engine, GARBAGE, session="s")
        after = await execute(engine, "print('kept' in globals())", session="s")

    assert (attacked.status, attacked.session) == ("error", "kept")
    assert attacked.error is not None and "state is lost" in attacked.error
    assert (after.status, after.session, after.stdout) == ("success", "new", "False\n")
