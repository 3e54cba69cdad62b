"""A pre-started TypeScript container's run is answered once its runner has ended, before the
container is torn down (``sandbox/backends/container/ending.py``), on podman and docker for real."""

from __future__ import annotations

import textwrap

import anyio
import pytest

from mcp_sandbox.engine import Engine, ExecutionRequest
from mcp_sandbox.engine.run_frames import RunRecord
from mcp_sandbox.sandbox.backends import SandboxOutcome

from .conftest import EngineFactory

# Serial and quiet: the early answer is taken only when the engine polls between the runner's end
# and the container's; on a loaded machine the loop can wake after both, and the run is then
# (rightly) answered at the container's end, which these tests exist to tell apart. Seen once at
# load 5-8, and once beside two other workers' sandboxes. Each runner touches 150 MiB (as
# tests/engine/test_prestart.py's does) so that the window, the kernel's teardown of its address
# space after it entered its exit, outlasts the engine's poll (every 5 ms at most): with less,
# beside busy cores, runs were answered late (the commit that raised it has the figures).
_BLOCK = "const block = new Uint8Array(150 << 20); block.fill(1);"
pytestmark = [pytest.mark.sandbox, pytest.mark.anyio, pytest.mark.serial, pytest.mark.quiet]

_START_SECONDS = 120.0


async def _take_and_run(engine: Engine, code: str) -> tuple[SandboxOutcome | None, RunRecord]:
    """Run ``code`` in a pre-started TypeScript container as the pool does, asking for the early answer."""
    with anyio.fail_after(_START_SECONDS):
        while engine.prestart.ready("typescript") < 1:
            engine.prestart.fill("typescript")
            await anyio.sleep(0.1)
    sandbox = await engine.prestart.take("typescript")
    assert sandbox is not None
    record = RunRecord.capped(1 << 20)
    try:
        with anyio.fail_after(60):
            request = ExecutionRequest(code=textwrap.dedent(code), timeout=30.0, language="typescript")
            outcome = await sandbox.interpreter.run(record, request, last=True, early=True)
    finally:
        sandbox.used.set()
    return outcome, record


async def test_a_run_is_answered_once_its_runner_has_ended_with_its_exit_status(
    make_container_engine: EngineFactory,
) -> None:
    engine = make_container_engine(prestart_size=1)
    code = f"""
        {_BLOCK}
        console.log(block[7]);
        process.exitCode = 3;
    """
    async with engine.running():
        outcome, record = await _take_and_run(engine, code)

    assert outcome is not None, "answered only once the whole container had ended"
    assert (outcome.returncode, outcome.memory_exceeded) == (3, False)
    assert (record.stdout.text(), record.exit_code) == ("1\n", 3)


async def test_an_early_answer_has_all_the_output_even_what_exit_handlers_write(
    make_container_engine: EngineFactory,
) -> None:
    engine = make_container_engine(prestart_size=1)
    code = f"""
        {_BLOCK}
        process.on("exit", () => {{ for (let i = 0; i < 2000; i++) console.log("late " + i); }});
        console.log("x".repeat(100000));
        process.exitCode = 5;
    """
    async with engine.running():
        outcome, record = await _take_and_run(engine, code)

    assert outcome is not None and outcome.returncode == 5
    lines = record.stdout.text().splitlines()
    assert lines[0] == "x" * 100000 and lines[1:] == [f"late {i}" for i in range(2000)]
