"""Sessions born of session-ready sandboxes (a runner started ahead on an empty slot) on the real bwrap backend.

Each test waits until the pool has a sandbox ready, and checks that the session's interpreter is
that sandbox's runner (``boot.py --ready=...``): a test that cannot pass on a session started
from nothing.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import textwrap
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import pytest

from mcp_sandbox.engine import Engine, ExecutionResult

from .conftest import RunningEngine
from .helpers import execute, host_processes, poll, spawn_marked, wait_until_gone
from .test_warm import _FRESH_STATE, _SCHEDULING_ATTACK

pytestmark = [pytest.mark.sandbox, pytest.mark.anyio]

MiB = 1 << 20
# The session's interpreter says whether it is a session-ready sandbox's runner.
_PARENT = "import os\nprint(b'--ready=' in open('/proc/self/cmdline', 'rb').read(), flush=True)\n"


# The processes of the run's sandbox (its pid namespace), the run's own pid, and its init's program.
_PROCESSES = """
import os
listing = sorted(int(pid) for pid in os.listdir('/proc') if pid.isdigit())
print(listing, os.getpid(), os.path.basename(open('/proc/1/cmdline', 'rb').read().split(b'\\0')[0]).decode())
"""


def _ok(result: ExecutionResult) -> ExecutionResult:
    assert result.status == "success", f"{result.status}: {result.error}\n{result.stderr}"
    return result


async def _wait_ready(engine: Engine, count: int = 1) -> None:
    with anyio.fail_after(60):
        await poll(lambda: engine.ready.idle >= count)


@contextlib.asynccontextmanager
async def _ready_engine(running_engine: RunningEngine, **flags: Any) -> AsyncIterator[Engine]:
    """A running engine with a session-ready sandbox idle (and no warm pool to confuse the counts)."""
    async with running_engine(**{"pool_size": 0, "pool_min": 0, **flags}) as engine:
        engine.ready.wake()
        await _wait_ready(engine, engine.settings.sessions.session_ready)
        yield engine


def _conversation(engine: Engine, root: Path, name: str) -> Path:
    """A conversation's directory as the workspace store makes one (0700, the sandbox uid's)."""
    directory = root / name
    directory.mkdir(mode=0o700)
    if os.geteuid() == 0:
        os.chown(directory, engine.settings.sandbox.sandbox_uid, engine.settings.sandbox.sandbox_gid)
    return directory


async def _born(engine: Engine, code: str, workspace: Path, session: str) -> ExecutionResult:
    """The first run of ``session``, which must be born of a ready sandbox; ``code``'s output follows the check's."""
    result = _ok(await execute(engine, _PARENT + textwrap.dedent(code), session=session, workspace=workspace))
    head, _, rest = result.stdout.partition("\n")
    assert (result.session, head) == ("new", "True"), "the session was not born of a session-ready sandbox"
    return dataclasses.replace(result, stdout=rest)


async def test_a_conversations_first_run_is_born_of_a_ready_sandbox_on_its_files_and_keeps_its_variables(
    running_engine: RunningEngine, state_dir: Path
) -> None:
    async with _ready_engine(running_engine) as engine:
        workspace = _conversation(engine, state_dir, "conversation")
        (workspace / "earlier.txt").write_text("from before")
        first = await _born(
            engine,
            "print(open('/workspace/earlier.txt').read())\nopen('/workspace/new.txt', 'w').write('hi')\nkept = 41",
            workspace,
            "s",
        )
        second = _ok(await execute(engine, "kept += 1\nprint(kept)", session="s", workspace=workspace))
        runs = sorted(entry.name for entry in (state_dir / "runs").iterdir())

    assert first.stdout == "from before\n"
    assert (second.session, second.stdout) == ("kept", "42\n")
    assert (workspace / "new.txt").read_text() == "hi"  # written where the conversation lives on the host
    assert sorted(os.listdir(workspace)) == ["earlier.txt", "new.txt"]
    assert not any(name.endswith(("earlier.txt", "new.txt")) for name in runs)
    assert workspace.stat().st_mode & 0o777 == 0o700


async def test_a_first_run_naming_no_preloaded_module_is_born_light_and_one_naming_pandas_preloaded(
    running_engine: RunningEngine, state_dir: Path
) -> None:
    # A light session holds only what its code loads; one whose code names pandas starts with it loaded.
    # The names are computed: the choice is a substring test of the code (the second run's comment).
    loaded = "import sys\nprint(sorted(name for name in ('num' + 'py', 'pan' + 'das') if name in sys.modules))\n"
    async with _ready_engine(running_engine, session_ready=2) as engine:
        light = await _born(engine, loaded, _conversation(engine, state_dir, "light"), "light")
        await _wait_ready(engine, 2)  # the light one's replacement
        heavy = await _born(engine, loaded + "# pandas", _conversation(engine, state_dir, "heavy"), "heavy")

    assert light.stdout == "[]\n"
    assert heavy.stdout == "['numpy', 'pandas']\n"


async def test_two_conversations_born_of_ready_sandboxes_never_see_each_others_files(
    running_engine: RunningEngine, state_dir: Path
) -> None:
    async with _ready_engine(running_engine, session_ready=2) as engine:
        one = _conversation(engine, state_dir, "one")
        two = _conversation(engine, state_dir, "two")
        (one / "one.txt").write_text("1")
        (two / "two.txt").write_text("2")
        listing = "import os\nprint(sorted(os.listdir('/workspace')))\nopen('/workspace/mine', 'w').write('x')"
        seen = {}
        async with anyio.create_task_group() as runs:

            async def run(name: str, workspace: Path) -> None:
                seen[name] = await _born(engine, listing, workspace, name)

            runs.start_soon(run, "one", one)
            runs.start_soon(run, "two", two)
        again = _ok(
            await execute(engine, "import os\nprint(sorted(os.listdir('/workspace')))", session="one", workspace=one)
        )

    assert seen["one"].stdout == "['one.txt']\n"
    assert seen["two"].stdout == "['two.txt']\n"
    assert again.stdout == "['mine', 'one.txt']\n"
    assert sorted(os.listdir(two)) == ["mine", "two.txt"]


async def test_a_conversation_born_again_after_its_session_ended_still_has_its_files(
    running_engine: RunningEngine, state_dir: Path
) -> None:
    async with _ready_engine(running_engine) as engine:
        workspace = _conversation(engine, state_dir, "conversation")
        await _born(engine, "open('/workspace/kept.txt', 'w').write('kept')\nx = 1", workspace, "s")
        assert await engine.end_session("s")
        assert (workspace / "kept.txt").read_text() == "kept"  # the sandbox went, the files stayed
        await _wait_ready(engine)
        again = await _born(engine, "print(open('/workspace/kept.txt').read(), 'x' in globals())", workspace, "s")

    assert again.stdout == "kept False\n"
    assert sorted(os.listdir(workspace)) == ["kept.txt"]


async def test_a_born_session_is_stopped_when_it_writes_past_its_quota(
    running_engine: RunningEngine, state_dir: Path
) -> None:
    # Many files, each well under the run's file size limit: only the disk watch (inotify on the
    # conversation's directory, which the claim renamed into place) sees the quota crossed.
    code = f"""
import time
for index in range(64):
    with open(f"/workspace/part{{index}}", "wb") as out:
        out.write(b"x" * {MiB // 2})
    time.sleep(0.02)
print("all written")
"""
    async with _ready_engine(running_engine, quota_bytes="4m") as engine:
        workspace = _conversation(engine, state_dir, "conversation")
        result = await execute(engine, _PARENT + code, session="s", workspace=workspace, time_limit=20)

    assert result.stdout.startswith("True\n"), "the session was not born of a session-ready sandbox"
    assert result.status == "error" and "all written" not in result.stdout
    assert result.limits == ("disk",), result.error
    assert sum(path.stat().st_size for path in workspace.iterdir()) < 8 * MiB


async def test_a_session_ready_sandbox_is_not_used_for_a_workspace_another_run_is_using(
    running_engine: RunningEngine, state_dir: Path
) -> None:
    # Claiming one renames the conversation's directory; a run on it in a sandbox of its own
    # (here a session-less one) would lose its /workspace.
    async with _ready_engine(running_engine) as engine:
        workspace = _conversation(engine, state_dir, "conversation")
        async with anyio.create_task_group() as runs:

            async def elsewhere() -> None:
                _ok(await execute(engine, "import time; time.sleep(2)", workspace=workspace))

            runs.start_soon(elsewhere)
            with anyio.fail_after(10):
                await poll(lambda: engine.admission.running == 1)  # it holds the workspace from here on
            cold = _ok(await execute(engine, _PARENT, session="s", workspace=workspace))

    assert cold.stdout == "False\n"


async def test_a_session_ready_sandbox_leaves_no_slot_behind_when_the_engine_stops(
    running_engine: RunningEngine, state_dir: Path
) -> None:
    async with _ready_engine(running_engine) as engine:
        workspace = _conversation(engine, state_dir, "conversation")
        await _born(engine, "pass", workspace, "s")
        await _wait_ready(engine)

    assert [entry.name for entry in (state_dir / "runs").iterdir() if "-etc-" not in entry.name] == []
    assert workspace.is_dir()


async def test_a_born_session_starts_in_the_state_of_one_started_from_nothing(
    running_engine: RunningEngine, state_dir: Path
) -> None:
    # The red-team checks of warm residue (issue 21, finding 9) on sessions: scheduling policy,
    # I/O priority, xattrs, modes and descriptors as a session started from nothing has them; an
    # attack on them fares as it does there, and leaves nothing to the session born next.
    async with running_engine(session_ready=0, pool_size=0, pool_min=0) as engine:
        workspace = _conversation(engine, state_dir, "cold")
        cold = _ok(await execute(engine, _PARENT + textwrap.dedent(_FRESH_STATE), session="cold", workspace=workspace))
        cold_attack = _ok(await execute(engine, _SCHEDULING_ATTACK, session="cold-attack", workspace=None))
    async with _ready_engine(running_engine) as engine:
        born = await _born(engine, _FRESH_STATE, _conversation(engine, state_dir, "one"), "one")
        await _wait_ready(engine)
        attack = await _born(engine, _SCHEDULING_ATTACK, _conversation(engine, state_dir, "two"), "two")
        await engine.end_session("two")
        await _wait_ready(engine)
        after = await _born(engine, _FRESH_STATE, _conversation(engine, state_dir, "three"), "three")

    assert cold.stdout.startswith("False\n")  # started from nothing
    # Its parent is its sandbox's init (pid 1) in both: there is no zygote left to aim at.
    assert eval(attack.stdout) == eval(cold_attack.stdout), (attack.stdout, cold_attack.stdout)
    assert eval(born.stdout) == eval(after.stdout) == eval(cold.stdout.partition("\n")[2])
    assert eval(born.stdout)["xattrs"] == [[], [], []]


async def test_the_first_conversations_run_starts_the_session_ready_sandboxes(
    running_engine: RunningEngine, state_dir: Path
) -> None:
    # A server whose runs name no conversation keeps none; the first session that could be born
    # of one starts from nothing and wakes the pool, the next is born of it.
    async with running_engine(pool_size=0, pool_min=0) as engine:
        _ok(await execute(engine, "print(1)"))
        assert engine.ready.idle == 0
        first = _ok(await execute(engine, _PARENT, session="a", workspace=_conversation(engine, state_dir, "a")))
        await _wait_ready(engine)
        await _born(engine, "pass", _conversation(engine, state_dir, "b"), "b")

    assert first.stdout == "False\n"


async def test_a_born_session_is_held_to_its_memory_and_cpu_limits(
    running_engine: RunningEngine, state_dir: Path
) -> None:
    # The limits live in the sandbox (its cgroup, the session's CPU budget), which its runner
    # has had from its start: hit, each ends the session as it ends one started from nothing.
    hog = "blocks = []\nwhile True:\n    blocks.append(bytearray(16 << 20))"
    async with _ready_engine(running_engine, session_ready=2, session_cpu_seconds=2) as engine:
        workspace = _conversation(engine, state_dir, "memory")
        await _born(engine, "kept = 1", workspace, "memory")
        memory = await execute(engine, hog, session="memory", workspace=workspace, time_limit=30)
        after = _ok(await execute(engine, "print('kept' in globals())", session="memory", workspace=workspace))
        spinner = _conversation(engine, state_dir, "cpu")
        await _wait_ready(engine)  # the one after the memory hog is born of one too
        await _born(engine, "kept = 1", spinner, "cpu")
        spun = await execute(engine, "while True:\n    pass", session="cpu", workspace=spinner, time_limit=30)

    assert (memory.status, memory.session, memory.limits) == ("error", "kept", ("memory",)), memory.error
    assert memory.error is not None and "state is lost" in memory.error
    assert (after.session, after.stdout) == ("new", "False\n")
    assert (spun.status, spun.session) == ("error", "kept")
    assert spun.error is not None and "SIGXCPU" in spun.error and "state is lost" in spun.error


async def test_what_a_born_sessions_runs_leave_behind_is_reaped_not_left_as_zombies(
    running_engine: RunningEngine, state_dir: Path
) -> None:
    # Orphans of the session's runs go to the sandbox's init (bwrap's pid 1), which reaps them: a
    # zombie would count against the pids limit until the session ends.
    orphans = """
        import os
        for _ in range(20):
            if os.fork() == 0:
                if os.fork() == 0:
                    os._exit(0)  # an orphan once its parent is gone
                os._exit(0)
            os.wait()
    """
    zombies = """
        import os, time
        def zombies():
            found = []
            for pid in filter(str.isdigit, os.listdir("/proc")):
                try:
                    if open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0] == "Z":
                        found.append(pid)
                except OSError:
                    pass
            return found
        deadline = time.monotonic() + 5
        while zombies() and time.monotonic() < deadline:
            time.sleep(0.05)
        print(zombies())
    """
    async with _ready_engine(running_engine) as engine:
        workspace = _conversation(engine, state_dir, "conversation")
        await _born(engine, orphans, workspace, "s")
        seen = _ok(await execute(engine, zombies, session="s", workspace=workspace))

    assert (seen.session, seen.stdout) == ("kept", "[]\n")


async def test_a_born_idle_sessions_sandbox_holds_its_interpreter_alone_as_one_started_from_nothing(
    running_engine: RunningEngine, state_dir: Path
) -> None:
    # No zygote stays beside the session's interpreter (issue 38: it cost a born session more
    # memory while idle): the interpreter is its sandbox's first process under bwrap's init, and
    # the only other one, as in a session started from nothing.
    async with running_engine(session_ready=0, pool_size=0, pool_min=0) as engine:
        workspace = _conversation(engine, state_dir, "cold")
        cold = _ok(await execute(engine, _PARENT + _PROCESSES, session="cold", workspace=workspace))
    async with _ready_engine(running_engine) as engine:
        workspace = _conversation(engine, state_dir, "born")
        first = await _born(engine, _PROCESSES, workspace, "born")
        idle = _ok(await execute(engine, _PROCESSES, session="born", workspace=workspace))

    assert cold.stdout == "False\n[1, 2] 2 bwrap\n"
    assert first.stdout == "[1, 2] 2 bwrap\n"
    assert (idle.session, idle.stdout) == ("kept", "[1, 2] 2 bwrap\n")


async def test_a_born_sessions_exit_codes_and_death_are_told_and_its_background_processes_end_with_it(
    running_engine: RunningEngine, state_dir: Path
) -> None:
    # What the zygote used to do as the session's reaper (wait for its interpreter, pass its
    # exit status on) is the sandbox's own now: the interpreter is its first process.
    died_marker = f"born-died-{uuid.uuid4().hex}"
    ended_marker = f"born-ended-{uuid.uuid4().hex}"
    async with _ready_engine(running_engine, session_ready=2) as engine:
        workspace = _conversation(engine, state_dir, "died")
        await _born(engine, spawn_marked(died_marker) + "\nkept = 1", workspace, "died")
        alive_between_runs = host_processes(died_marker) != []
        exited = await execute(engine, "raise SystemExit(3)", session="died", workspace=workspace)
        kept = _ok(await execute(engine, "print(kept)", session="died", workspace=workspace))
        died = await execute(engine, "import os\nos.kill(os.getpid(), 9)", session="died", workspace=workspace)
        died_gone = await wait_until_gone(died_marker)
        await _wait_ready(engine)
        other = _conversation(engine, state_dir, "ended")
        await _born(engine, spawn_marked(ended_marker), other, "ended")
        assert await engine.end_session("ended")
        ended_gone = await wait_until_gone(ended_marker)

    assert alive_between_runs  # as in a session started from nothing, until the session ends
    assert (exited.status, exited.exit_code, exited.session) == ("error", 3, "kept")
    assert kept.stdout == "1\n"
    assert (died.status, died.exit_code, died.session) == ("error", 137, "kept")
    assert died.error is not None and "SIGKILL" in died.error and "state is lost" in died.error
    assert died_gone == ended_gone == []
