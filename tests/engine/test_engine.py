"""Which way a run goes (fresh, session, never warm without a warm pool), on the test double.

The double (tests/doubles/sandbox.py) runs the real runner unconfined and records every policy
it starts, so these tests need no bwrap. The warm and pre-started paths fork from a zygote,
which only a real sandbox can hold: tests/engine/test_warm.py and test_prestart.py cover them.
"""

from __future__ import annotations

from collections.abc import Callable

import anyio
import pytest

from doubles.sandbox import PlainProcessBackend
from mcp_sandbox.config import Settings
from mcp_sandbox.engine import Engine, ExecutionRequest, ExecutionResult
from mcp_sandbox.engine.startup import engine_for

pytestmark = pytest.mark.anyio

BOUND = 30.0


async def run(engine: Engine, code: str, *, session: str | None = None, reset: bool = False) -> ExecutionResult:
    with anyio.fail_after(BOUND):
        return await engine.execute(ExecutionRequest(code=code, timeout=10, session=session, reset=reset))


def engine_on(backend: PlainProcessBackend, settings: Settings) -> Engine:
    engine = engine_for(settings, backend)
    engine.prepare()
    return engine


async def test_a_run_without_a_session_gets_a_fresh_sandbox_of_its_own(
    plain_settings: Callable[..., Settings],
) -> None:
    backend = PlainProcessBackend()
    async with engine_on(backend, plain_settings()).running() as engine:
        first = await run(engine, "import os; print(os.getpid()); x = 1")
        second = await run(engine, "import os; print(os.getpid()); print('x' in globals())")

    assert len(backend.started) == 2
    assert first.stdout.splitlines()[0] != second.stdout.splitlines()[0]
    assert second.stdout.splitlines()[1] == "False"
    assert (first.warm, second.warm, first.session, second.session) == (False, False, None, None)


async def test_a_run_without_a_session_runs_fresh_outside_running_too(plain_settings: Callable[..., Settings]) -> None:
    backend = PlainProcessBackend()

    result = await run(engine_on(backend, plain_settings()), "print('cold')")

    assert (result.status, result.stdout) == ("success", "cold\n")
    assert len(backend.started) == 1


async def test_the_runs_of_a_session_share_one_interpreter(plain_settings: Callable[..., Settings]) -> None:
    backend = PlainProcessBackend()
    async with engine_on(backend, plain_settings()).running() as engine:
        first = await run(engine, "x = 41", session="s")
        second = await run(engine, "print(x + 1)", session="s")

    assert (first.session, second.session) == ("new", "kept")
    assert second.stdout == "42\n"
    assert len(backend.started) == 1


async def test_two_sessions_have_interpreters_of_their_own(plain_settings: Callable[..., Settings]) -> None:
    backend = PlainProcessBackend()
    async with engine_on(backend, plain_settings()).running() as engine:
        await run(engine, "x = 'a'", session="a")
        other = await run(engine, "print('x' in globals())", session="b")

    assert (other.session, other.stdout) == ("new", "False\n")
    assert len(backend.started) == 2


async def test_a_reset_starts_the_session_over(plain_settings: Callable[..., Settings]) -> None:
    backend = PlainProcessBackend()
    async with engine_on(backend, plain_settings()).running() as engine:
        await run(engine, "x = 1", session="s")
        reset = await run(engine, "print('x' in globals())", session="s", reset=True)

    assert (reset.session, reset.stdout) == ("new", "False\n")


async def test_with_sessions_off_a_run_naming_a_session_runs_fresh(plain_settings: Callable[..., Settings]) -> None:
    backend = PlainProcessBackend()
    async with engine_on(backend, plain_settings(sessions=False)).running() as engine:
        await run(engine, "x = 1", session="s")
        second = await run(engine, "print('x' in globals())", session="s")

    assert (second.session, second.stdout) == (None, "False\n")
    assert len(backend.started) == 2


async def test_a_session_run_outside_running_is_refused(plain_settings: Callable[..., Settings]) -> None:
    engine = engine_on(PlainProcessBackend(), plain_settings())

    with pytest.raises(RuntimeError):
        await run(engine, "x = 1", session="s")


async def test_a_backend_without_a_warm_pool_never_gets_a_zygote(plain_settings: Callable[..., Settings]) -> None:
    backend = PlainProcessBackend()
    async with engine_on(backend, plain_settings(pool_size=4, pool_min=1)).running() as engine:
        results = [await run(engine, "print('ok')") for _ in range(3)]

    assert [r.warm for r in results] == [False, False, False]
    assert not any("--zygote" in argument for policy in backend.started for argument in policy.command)
