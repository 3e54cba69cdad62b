"""Reading a runner's end from /proc (sandbox/backends/runner.py), on real processes shaped like a sandbox's.

A chain ``outer -> middle -> runner`` stands for bwrap, its pid 1 and the runtime; the middle
process never reaps the runner, so its end stays readable (a zombie) as in the moment between a
runtime's exit and its teardown. A file listing pids stands for the sandbox's ``cgroup.procs``.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from mcp_sandbox.sandbox.backends.runner import Runner, find_runner, runner_of

# The middle process forks the runner and sleeps without reaping it; the runner waits for a
# line on stdin (inherited), then exits with the code it read, or by SIGTERM if it read "kill".
_CHAIN = """
import os, signal, sys, time
pid = os.fork()
if pid == 0:
    line = sys.stdin.readline().strip()
    if line == "kill":
        os.kill(os.getpid(), signal.SIGTERM)
    os._exit(int(line))
print(pid, flush=True)
time.sleep(60)
"""


@pytest.fixture
def chain() -> Iterator[subprocess.Popen[str]]:
    middle = f"import subprocess, sys; subprocess.run([sys.executable, '-c', {_CHAIN!r}])"
    with subprocess.Popen(
        [sys.executable, "-c", middle],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,  # a group of its own: the chain ends whole (the middle would sleep on)
    ) as outer:
        try:
            assert outer.stdout is not None
            outer.stdout.readline()  # the runner has been forked
            yield outer
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(outer.pid, signal.SIGKILL)


def _procs(tmp_path: Path, runner: Runner, *extra: int) -> str:
    path = tmp_path / "cgroup.procs"
    path.write_text("".join(f"{pid}\n" for pid in (*runner.bwrap, runner.pid, *extra)))
    return str(path)


def _end(outer: subprocess.Popen[str], line: str) -> None:
    assert outer.stdin is not None
    outer.stdin.write(line + "\n")
    outer.stdin.flush()


def _wait_ended(runner: Runner, procs: str) -> int | None:
    deadline = time.monotonic() + 10
    while (code := runner.ended(procs)) is None and time.monotonic() < deadline:
        time.sleep(0.01)
    return code


def test_a_running_runner_has_not_ended_and_one_that_exited_gives_its_exit_code(
    chain: subprocess.Popen[str], tmp_path: Path
) -> None:
    runner = find_runner(chain.pid)
    assert runner is not None and len(runner.bwrap) == 2 and chain.pid in runner.bwrap
    procs = _procs(tmp_path, runner)
    assert runner.ended(procs) is None  # alive, waiting for its line
    _end(chain, "7")
    assert _wait_ended(runner, procs) == 7


def test_a_runner_killed_by_a_signal_ends_with_128_plus_it(chain: subprocess.Popen[str], tmp_path: Path) -> None:
    runner = find_runner(chain.pid)
    assert runner is not None
    procs = _procs(tmp_path, runner)
    _end(chain, "kill")
    assert _wait_ended(runner, procs) == 128 + 15


def test_no_end_is_read_while_another_process_is_in_the_sandbox(chain: subprocess.Popen[str], tmp_path: Path) -> None:
    runner = find_runner(chain.pid)
    assert runner is not None
    with subprocess.Popen(["sleep", "30"]) as other:
        try:
            procs = _procs(tmp_path, runner, other.pid)
            _end(chain, "0")
            time.sleep(0.3)
            assert runner.ended(procs) is None
            assert runner.ended(_procs(tmp_path, runner)) == 0  # once it is gone
        finally:
            other.kill()


def test_a_reused_pid_is_not_taken_for_the_runner(chain: subprocess.Popen[str], tmp_path: Path) -> None:
    runner = find_runner(chain.pid)
    assert runner is not None
    other = Runner(runner.pid, runner.start + 1, runner.bwrap)  # another process's start time
    procs = _procs(tmp_path, runner)
    _end(chain, "0")
    assert _wait_ended(runner, procs) == 0
    assert other.ended(procs) is None


def test_a_lone_runner_taken_by_its_pid_has_its_end_read(chain: subprocess.Popen[str], tmp_path: Path) -> None:
    found = find_runner(chain.pid)
    assert found is not None
    runner = runner_of(found.pid)  # as a container's: alone in its cgroup
    assert runner is not None and runner.bwrap == frozenset()
    procs = _procs(tmp_path, runner)
    assert runner.ended(procs) is None
    _end(chain, "3")
    assert _wait_ended(runner, procs) == 3


def test_a_process_tree_of_another_shape_has_no_runner() -> None:
    with subprocess.Popen(["sleep", "30"]) as alone:
        try:
            assert find_runner(alone.pid) is None  # no child at all
        finally:
            alone.kill()
