"""How a run's end is put into its result (status, exit code, error, truncation), on the test double.

The double (tests/doubles/sandbox.py) runs the real runner unconfined: what is judged here is
what the runner and the host say, not what a limit enforces (tests/sandbox attacks those).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable

import anyio
import pytest

from doubles.sandbox import PlainProcessBackend
from mcp_sandbox.config import Settings
from mcp_sandbox.engine import ExecutionRequest, ExecutionResult
from mcp_sandbox.engine.startup import engine_for

pytestmark = pytest.mark.anyio

BOUND = 30.0

Run = Callable[..., Awaitable[ExecutionResult]]


@pytest.fixture(params=["fresh", "session"])
async def execute(request: pytest.FixtureRequest, plain_settings: Callable[..., Settings]) -> AsyncIterator[Run]:
    """``await execute(code, time_limit=...)``: a run in a fresh sandbox, or in a session's."""
    session = "s" if request.param == "session" else None
    engine = engine_for(plain_settings(max_output=64 << 10), PlainProcessBackend())
    engine.prepare()
    async with engine.running():

        async def run(code: str, time_limit: float = 10) -> ExecutionResult:
            with anyio.fail_after(time_limit + BOUND):
                return await engine.execute(ExecutionRequest(code=code, timeout=time_limit, session=session))

        yield run


async def test_code_that_ends_normally_is_a_success_with_exit_code_zero(execute: Run) -> None:
    result = await execute("print('done')")

    assert (result.status, result.exit_code, result.stdout, result.error) == ("success", 0, "done\n", None)


async def test_an_uncaught_exception_is_an_error_with_exit_code_one_and_its_traceback(execute: Run) -> None:
    result = await execute("x = 1\nraise ValueError('boom')")

    assert (result.status, result.exit_code) == ("error", 1)
    assert "ValueError: boom" in result.stderr
    assert "line 2" in result.stderr


async def test_a_run_ending_on_its_own_memory_error_names_the_memory_limit(execute: Run) -> None:
    # What an allocation past RLIMIT_AS gives, where no memory cgroup is writable (a container).
    result = await execute("hog = []\nraise MemoryError()")

    assert (result.status, result.exit_code, result.limits) == ("error", 1, ("memory",))
    assert result.error is not None and result.error.startswith("memory limit of ")
    assert "MemoryError" in result.stderr


async def test_a_memory_error_caught_by_the_code_is_no_limit_hit(execute: Run) -> None:
    result = await execute("try:\n    raise MemoryError()\nexcept MemoryError:\n    print('coped')")

    assert (result.status, result.limits, result.error) == ("success", (), None)


@pytest.mark.parametrize(("code", "status", "exit_code"), [(3, "error", 3), (0, "success", 0)])
async def test_sys_exit_gives_its_code(execute: Run, code: int, status: str, exit_code: int) -> None:
    result = await execute(f"import sys\nsys.exit({code})")

    assert (result.status, result.exit_code) == (status, exit_code)


async def test_code_past_its_timeout_is_stopped_with_status_timeout(execute: Run) -> None:
    result = await execute("import time\ntime.sleep(30)", time_limit=0.5)

    assert (result.status, result.exit_code, result.limits) == ("timeout", 124, ("timeout",))
    assert result.error is not None and "timed out" in result.error
    assert result.duration_ms >= 500


async def test_output_past_max_output_is_truncated_and_says_so(execute: Run) -> None:
    result = await execute("import sys\nsys.stdout.write('BEGIN' + 'x' * (1 << 20))")

    assert (result.status, result.truncated) == ("success", True)
    assert result.stdout.startswith("BEGIN")
    assert len(result.stdout) < 128 << 10


async def test_stderr_is_kept_apart_from_stdout(execute: Run) -> None:
    result = await execute("import sys\nprint('out')\nprint('err', file=sys.stderr)")

    assert (result.stdout, result.stderr) == ("out\n", "err\n")
