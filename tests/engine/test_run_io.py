"""Each run's stdout/stderr and environment travel over the channel, fresh runs and session runs alike."""

from __future__ import annotations

import time
import uuid
from functools import partial

import anyio
import pytest

from mcp_sandbox.engine.output import DRAIN_SECONDS

from .conftest import RunningEngine
from .helpers import HOST_BOUND, execute, host_processes, poll, spawn_marked

pytestmark = [pytest.mark.sandbox, pytest.mark.anyio]

NOISE = """
import subprocess
noisy = subprocess.Popen(["/bin/sh", "-c", "while true; do echo noise; echo noise >&2; sleep 0.01; done"])
import time
time.sleep(0.1)
print("run one done", flush=True)
"""


async def test_a_background_process_still_writing_does_not_reach_the_next_runs_output(
    running_engine: RunningEngine,
) -> None:
    async with running_engine() as engine:
        started = time.monotonic()
        first = await execute(engine, NOISE, session="s")
        first_took = time.monotonic() - started
        second = await execute(engine, "import time\ntime.sleep(0.2)\nprint('clean')", session="s")
        third = await execute(engine, "print(noisy.poll() is not None)", session="s")

    assert first.status == "success"
    assert "noise" in first.stdout and first.stdout.rstrip().endswith(("noise", "run one done"))
    # The host stopped reading the first run's pipes shortly after its DONE.
    assert first_took < 0.1 + DRAIN_SECONDS + 5
    assert (second.stdout, second.stderr) == ("clean\n", "")
    # With nobody reading its pipes any more, the writer died of SIGPIPE.
    assert third.stdout == "True\n"


async def test_a_background_process_of_a_fresh_run_does_not_hold_up_its_result(running_engine: RunningEngine) -> None:
    async with running_engine() as engine:
        result = await execute(engine, spawn_marked(f"held-{uuid.uuid4().hex}", keep_output=True) + "\nprint('done')")

    assert (result.status, result.stdout) == ("success", "done\n")


async def test_the_environment_of_a_run_is_not_in_the_next_run_of_its_session(running_engine: RunningEngine) -> None:
    show = "import os\nprint(os.environ.get('API_TOKEN'), os.environ.get('FILE_BASE_URL'))"
    async with running_engine() as engine:
        first = await execute(
            engine, show, session="s", environment={"API_TOKEN": "s3cret", "FILE_BASE_URL": "http://h/f/c"}
        )
        second = await execute(engine, show, session="s")
        stored = await execute(
            engine,
            "import os\ntoken = os.environ.get('API_TOKEN')",
            session="s",
            environment={"API_TOKEN": "kept-by-the-code"},
        )
        third = await execute(engine, "print(token, os.environ.get('API_TOKEN'))", session="s")

    assert first.stdout == "s3cret http://h/f/c\n"
    assert second.stdout == "None None\n"
    assert stored.status == "success"
    assert third.stdout == "kept-by-the-code None\n"  # unless the code kept it in a variable


async def test_a_per_call_value_is_on_no_host_command_line_while_its_run_runs(running_engine: RunningEngine) -> None:
    secret = f"per-call-{uuid.uuid4().hex}"
    marker = f"cmdline-{uuid.uuid4().hex}"
    async with running_engine() as engine, anyio.create_task_group() as group:
        group.start_soon(
            partial(execute, engine, spawn_marked(marker) + "\nmarked.wait()", environment={"SECRET": secret})
        )
        with anyio.fail_after(HOST_BOUND):
            await poll(lambda: bool(host_processes(marker)))  # the sandbox is up, its run started
        on_the_host = host_processes(secret)  # bwrap's argv included
        group.cancel_scope.cancel()

    assert on_the_host == []


async def test_a_per_call_value_is_visible_to_the_code_but_not_on_proc_1(running_engine: RunningEngine) -> None:
    secret = f"per-call-{uuid.uuid4().hex}"
    code = f"""
import os
everywhere = [open(f"/proc/{{pid}}/cmdline", "rb").read() for pid in os.listdir("/proc") if pid.isdigit()]
print(os.environ.get("SECRET") == {secret!r}, {secret.encode()!r} in open("/proc/1/cmdline", "rb").read())
print(any({secret.encode()!r} in line for line in everywhere))
"""
    async with running_engine() as engine:
        fresh = await execute(engine, code, environment={"SECRET": secret})
        in_session = await execute(engine, code, session="s", environment={"SECRET": secret})

    assert fresh.stdout == in_session.stdout == "True False\nFalse\n"
