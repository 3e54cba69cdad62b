"""Pre-started single-use sandboxes (TypeScript here, on bun): one run each, fresh state, refilled, sized by config."""

from __future__ import annotations

import contextlib
import dataclasses
import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import pytest

from mcp_sandbox.config import load_settings
from mcp_sandbox.egress import EgressGrant, EgressRules
from mcp_sandbox.engine import Engine, ExecutionRequest
from mcp_sandbox.engine.prestart import DEFAULT_SIZES, fits_prestarted_sandbox, prestart_size
from mcp_sandbox.engine.run_frames import RunRecord
from mcp_sandbox.engine.runtimes import js_binary
from mcp_sandbox.engine.warm import fits_warm_sandbox

from .conftest import RunningEngine
from .helpers import execute, poll

pytestmark = [pytest.mark.sandbox, pytest.mark.anyio]

# The helpers' runs ask for 10 s: the pool's sandboxes have the limits of the default timeout.
_FLAGS: dict[str, Any] = {"timeout": 10.0, "js_runtime": "bun", "prestart_size": 2}


@pytest.fixture(autouse=True)
def _bun() -> None:
    binary = js_binary(load_settings(env={}, flags={}).paths, "bun")
    if not os.access(binary, os.X_OK):
        pytest.skip(f"bun is not installed at {binary}: run `make runtime`")


@contextlib.asynccontextmanager
async def prestarted(running_engine: RunningEngine, **flags: Any) -> AsyncIterator[Engine]:
    """A running engine whose TypeScript sandboxes have started (after a first run asked for them)."""
    async with running_engine(**{**_FLAGS, **flags}) as engine:
        await execute(engine, "console.log(1)", language="typescript", time_limit=engine.settings.limits.timeout)
        await wait_ready(engine, prestart_size(engine.settings.pool, "typescript"))
        yield engine


async def wait_ready(engine: Engine, count: int) -> None:
    with anyio.fail_after(60):
        await poll(lambda: engine.prestart.ready("typescript") >= count)


async def test_a_prestarted_sandbox_serves_one_run_and_the_next_sees_none_of_its_state(
    running_engine: RunningEngine,
) -> None:
    leave = """
        import { writeFileSync } from "node:fs";
        writeFileSync("/tmp/left", "x");
        writeFileSync("/workspace/left", "x");
        (globalThis as any).leftBehind = 42;
        console.log(process.pid);
    """
    look = """
        import { existsSync } from "node:fs";
        console.log(existsSync("/tmp/left"), existsSync("/workspace/left"), (globalThis as any).leftBehind);
    """
    async with prestarted(running_engine) as engine:
        first = await execute(engine, leave, language="typescript")
        second = await execute(engine, look, language="typescript")

    assert (first.status, first.warm) == ("success", True), first.stderr
    assert (second.status, second.warm) == ("success", True), second.stderr
    assert second.stdout == "false false undefined\n"


async def test_a_used_sandbox_is_destroyed_and_the_pool_refills(running_engine: RunningEngine) -> None:
    async with prestarted(running_engine) as engine:
        taken = await engine.prestart.take("typescript")
        assert taken is not None and engine.prestart.ready("typescript") == 1
        result = await execute(engine, "console.log('a')", language="typescript")
        assert result.warm  # the other one, which is then replaced
        await wait_ready(engine, 1)
        assert engine.prestart.size("typescript") == 2  # the one taken by hand is still there, unused
        taken.used.set()
        with anyio.fail_after(30):
            await taken.interpreter.exited.wait()  # destroyed by its owner once used
        await wait_ready(engine, 2)
        assert engine.prestart.size("typescript") == 2


@pytest.mark.parametrize("size", [1, 3])
async def test_the_number_of_sandboxes_is_prestart_size(running_engine: RunningEngine, size: int) -> None:
    async with prestarted(running_engine, prestart_size=size) as engine:
        await anyio.sleep(0.5)  # none more than asked for come up meanwhile
        assert engine.prestart.ready("typescript") == engine.prestart.size("typescript") == size


async def test_by_default_a_language_keeps_its_own_number_of_sandboxes(running_engine: RunningEngine) -> None:
    async with prestarted(running_engine, prestart_size=None) as engine:
        await anyio.sleep(0.5)  # none more than asked for come up meanwhile
        assert engine.prestart.ready("typescript") == engine.prestart.size("typescript") == 4
    assert DEFAULT_SIZES == {"typescript": 4, "javascript": 4, "python": 2}
    assert prestart_size(load_settings(env={"MCP_SANDBOX_PRESTART_SIZE": "1"}, flags={}).pool, "python") == 1


async def test_prestart_size_0_starts_none(running_engine: RunningEngine) -> None:
    async with running_engine(**{**_FLAGS, "prestart_size": 0}) as engine:
        result = await execute(engine, "console.log(1)", language="typescript")
        assert (result.stdout, result.warm) == ("1\n", False)
        assert engine.prestart.size("typescript") == 0


async def test_runs_with_other_limits_or_a_workspace_start_their_own(
    running_engine: RunningEngine, state_dir: Path
) -> None:
    workspace = state_dir.parent / "conversation"
    workspace.mkdir(mode=0o700)
    async with prestarted(running_engine) as engine:
        if os.geteuid() == 0:
            os.chown(workspace, engine.settings.sandbox.sandbox_uid, engine.settings.sandbox.sandbox_gid)
        longer = await execute(engine, "console.log(1)", language="typescript", time_limit=20.0)
        with_files = await execute(engine, "console.log(1)", language="typescript", workspace=workspace)
        assert engine.prestart.ready("typescript") == 2  # neither took one

    assert (longer.status, longer.warm) == ("success", False), longer.stderr
    assert (with_files.status, with_files.warm) == ("success", False), with_files.stderr


def test_only_a_run_shaped_like_the_pools_sandboxes_is_eligible(tmp_path: Any) -> None:
    settings = load_settings(env={}, flags={"timeout": 10.0})
    plain = ExecutionRequest(code="1", timeout=10.0, language="typescript")
    assert fits_prestarted_sandbox(settings.limits, plain)
    assert not fits_prestarted_sandbox(settings.limits, dataclasses.replace(plain, timeout=30.0))
    assert not fits_prestarted_sandbox(settings.limits, dataclasses.replace(plain, workspace=tmp_path))
    assert fits_warm_sandbox(dataclasses.replace(plain, language="python"))
    assert not fits_warm_sandbox(plain)
    assert not fits_warm_sandbox(dataclasses.replace(plain, language="python", workspace=tmp_path))
    # A run granted network takes neither kind of sandbox.
    grant = EgressGrant(EgressRules.build(["example.com"], [], [443], [], "test"), tenant="default")
    assert not fits_prestarted_sandbox(settings.limits, dataclasses.replace(plain, egress=grant))
    assert not fits_warm_sandbox(dataclasses.replace(plain, language="python", egress=grant))


async def test_a_timed_out_prestarted_run_is_killed_and_reported(running_engine: RunningEngine) -> None:
    async with prestarted(running_engine, timeout=2.0) as engine:
        result = await execute(engine, "while (true) {}", language="typescript", time_limit=2.0)
        await wait_ready(engine, 2)

    assert (result.status, result.warm) == ("timeout", True)


# Serial and quiet: the early answer is seen by polling in the window between the runner's exit and
# the sandbox's (tens of ms here); on a loaded machine the engine's loop can sleep through all of
# it, and the run is then answered, correctly, only once the sandbox has ended. Seen beside the
# background lane's sandboxes, at their lowest CPU weight.
@pytest.mark.serial
@pytest.mark.quiet
async def test_a_run_is_answered_once_its_runner_has_ended_with_the_kernels_exit_status(
    running_engine: RunningEngine,
) -> None:
    # 150 MiB touched: the kernel takes a while to tear the address space down after the runner
    # entered its exit, and bwrap ends only after that; the run's end is known before.
    code = """
        const block = new Uint8Array(150 << 20);
        block.fill(1);
        console.log(block[7]);
        process.exitCode = 3;
    """
    async with prestarted(running_engine) as engine:
        sandbox = await engine.prestart.take("typescript")
        assert sandbox is not None
        record = RunRecord.capped(1 << 20)
        try:
            with anyio.fail_after(30):
                request = ExecutionRequest(code=code, timeout=30.0, language="typescript")
                outcome = await sandbox.interpreter.run(record, request, last=True, early=True)
        finally:
            sandbox.used.set()

    assert outcome is not None, "answered only once the whole sandbox had ended"
    assert (outcome.returncode, outcome.memory_exceeded) == (3, False)
    assert (record.stdout.text(), record.exit_code) == ("1\n", 3)


async def test_an_early_answer_has_all_the_output_even_what_exit_handlers_write(
    running_engine: RunningEngine,
) -> None:
    code = """
        process.on("exit", () => { for (let i = 0; i < 2000; i++) console.log("late " + i); });
        console.log("x".repeat(100000));
        process.exitCode = 5;
    """
    async with prestarted(running_engine) as engine:
        results = [await execute(engine, code, language="typescript") for _ in range(3)]

    for result in results:
        assert (result.status, result.exit_code, result.warm) == ("error", 5, True), result.stderr
        lines = result.stdout.splitlines()
        assert lines[0] == "x" * 100000 and lines[1:] == [f"late {i}" for i in range(2000)]


async def test_a_run_that_leaves_a_process_behind_is_answered_when_its_sandbox_ends(
    running_engine: RunningEngine,
) -> None:
    # The child holds the run's stdout: the runner's end is not the run's, so no early answer.
    code = """
        import { spawn } from "node:child_process";
        spawn("/bin/sh", ["-c", "sleep 0.1; echo from-child"], { stdio: ["ignore", "inherit", "inherit"] }).unref();
        console.log("parent");
    """
    async with prestarted(running_engine) as engine:
        result = await execute(engine, code, language="typescript")

    assert (result.status, result.warm) == ("success", True), result.stderr
    assert result.stdout.startswith("parent\n")
