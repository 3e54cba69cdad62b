"""Container start-up and run latency: cold containers vs a session's warm one, next to bwrap.

    .venv/bin/python bench/container_latency.py [--runs N] [--language typescript]

Rows (medians and p95 over N runs, milliseconds):

- ``<cli> run /bin/true``: the container engine alone, a cold container per run;
- ``run --rm python``: ``<cli> run --rm --network none IMAGE python3 -c CODE``, a container
  per run the way both earlier systems ran code (the peer of the rows below);
- ``fresh run``: the engine's whole fresh run (container start, runner ready, EXEC, DONE,
  removal by name) printing one line, a cold container each time;
- ``warm run``: the same run on a running engine: a pre-started single-use container (bwrap: a
  zygote's fork), runs at least 0.3 s apart and each once one is ready (untimed: the pool
  refills in the background; a container's start and removal take a few hundred ms);
- ``session run``: the same code as the runs of one session, served by one warm container
  over the channel;
- the same two rows on bwrap, for comparison.

``--language typescript`` (or ``javascript``) times the engine's rows for a run of that language
on the configured JavaScript runtime (bun by default) instead, without the session row (a
conversation's TypeScript runs are fresh sandboxes) and the CLI's rows.

On these machines podman runs only with the test suite's workarounds, so the podman rows use
``tests/containers/podman-wrapper`` when this runs as root and the wrapper exists (the wrapper's
own ``unshare`` costs about 2 ms); the docker rows use the test suite's docker engine on its
private socket, through ``tests/containers/docker-wrapper``: started here (as the tests start
it, ``tests/container_helpers.docker_daemon``) when none answers, and stopped afterwards.
Absolute values drift by ±30% between runs on a shared 2-core machine; nothing is asserted.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path

import anyio

from mcp_sandbox.config import load_settings
from mcp_sandbox.engine import Engine, ExecutionRequest
from mcp_sandbox.engine.startup import backend_for, engine_for
from mcp_sandbox.workspace import remove_tree

REPO = Path(__file__).resolve().parents[1]
RUNTIME = REPO / ".runtime" / "python"
IMAGE = "localhost/mcp-sandbox-python:latest"
CODE = {"python": "print('hello')", "typescript": "console.log('hello');", "javascript": "console.log('hello');"}


def _cli(name: str) -> str | None:
    wrapper = REPO / "tests" / "containers" / f"{name}-wrapper"
    if os.geteuid() == 0 and wrapper.exists():
        return str(wrapper)
    return name


@contextlib.contextmanager
def _engine(name: str) -> Iterator[str | None]:
    """The test suite's docker engine for this block when run as root (why not, or None); podman has no daemon."""
    if name != "docker" or os.geteuid() != 0:
        yield None
        return
    sys.path.insert(0, str(REPO / "tests"))
    from container_helpers import docker_daemon

    with docker_daemon() as why:
        yield why


def _answers(cli: str) -> bool:
    try:
        return subprocess.run([cli, "info"], capture_output=True, timeout=30, check=False).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def _stats(samples: list[float]) -> str:
    ordered = sorted(samples)
    p95 = ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))]
    return f"median {statistics.median(ordered) * 1000:7.1f} ms   p95 {p95 * 1000:7.1f} ms   (n={len(ordered)})"


async def _timed(runs: int, action: Callable[[], Awaitable[None]]) -> list[float]:
    await action()  # warm-up: caches, the image's layers, the first sweep
    samples = []
    for _ in range(runs):
        started = time.perf_counter()
        await action()
        samples.append(time.perf_counter() - started)
    return samples


def prepared_engine(name: str, flags: dict[str, object], state: Path) -> Engine | None:
    """An engine on backend ``name`` with settings ``flags`` (the checkout's runtime, state under
    ``state``), prepared; None, saying why, when the backend does not answer."""
    values: dict[str, object] = {"state_dir": str(state / name), **flags}
    if (RUNTIME / "bin" / "python3").exists():
        values["python_runtime"] = str(RUNTIME)
    settings = load_settings(env={}, flags=values)
    backend = backend_for(settings, name)
    probe = backend.probe()
    if not probe.available:
        print(f"{name:<8} unavailable: {probe.reason}")
        return None
    engine = engine_for(settings, backend)
    engine.prepare()
    return engine


async def _bench_backend(name: str, flags: dict[str, object], runs: int, state: Path, language: str) -> None:
    engine = prepared_engine(name, flags, state)
    if engine is None:
        return
    backend, settings = engine.backend, engine.settings
    code = CODE[language]
    zygotes = backend.warm_pool and language == "python"

    async def fresh() -> None:
        result = await engine.execute(ExecutionRequest(code=code, timeout=30, language=language))
        assert result.stdout == "hello\n", result

    print(f"{name:<8} fresh run         {_stats(await _timed(runs, fresh))}")
    async with engine.running():

        async def warm() -> None:
            await anyio.sleep(0.3)  # not timed: the refill's head start
            with anyio.move_on_after(10):  # and, on a loaded machine, until one is ready
                while not (engine.pool.idle if zygotes else engine.prestart.ready(language)):  # noqa: ASYNC110
                    await anyio.sleep(0.05)
            started = time.perf_counter()
            request = ExecutionRequest(code=code, timeout=settings.limits.timeout, language=language)
            result = await engine.execute(request)
            timings.append(time.perf_counter() - started)
            assert result.stdout == "hello\n" and result.warm, result

        timings: list[float] = []
        for _ in range(3):  # the pool starts on the first run
            await fresh()
            await anyio.sleep(1.0)
        for _ in range(runs):
            await warm()
        print(f"{name:<8} warm run          {_stats(timings)}")
        if language != "python":
            return

        async def session() -> None:
            result = await engine.execute(ExecutionRequest(code=code, timeout=30, session="bench"))
            assert result.stdout == "hello\n", result

        print(f"{name:<8} session run       {_stats(await _timed(runs * 2, session))}")


async def _bench_cli(cli: str, label: str, runs: int) -> None:
    async def bare() -> None:
        await anyio.run_process([cli, "run", "--rm", "--network", "none", IMAGE, "/bin/true"])

    async def python() -> None:
        await anyio.run_process([cli, "run", "--rm", "--network", "none", IMAGE, "python3", "-c", CODE["python"]])

    print(f"{label:<8} `run /bin/true`    {_stats(await _timed(runs, bare))}")
    print(f"{label:<8} run --rm python    {_stats(await _timed(runs, python))}")


async def main(runs: int, language: str) -> None:
    state = Path(tempfile.mkdtemp(prefix="mcp-sandbox-bench-"))
    os.chmod(state, 0o711)
    try:
        await _bench_backend("bwrap", {}, runs, state, language)
        for name in ("podman", "docker"):
            cli = _cli(name)
            with _engine(name) as why:
                if why is not None or cli is None or not _answers(cli):
                    print(f"{name:<8} unavailable: {why or f'`{cli} info` does not answer'}")
                    continue
                if language == "python":
                    await _bench_cli(cli, name, runs)
                await _bench_backend(name, {"container_runtime": cli}, runs, state, language)
    finally:
        remove_tree(state)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=20, help="runs per row (sessions: twice as many)")
    parser.add_argument("--language", choices=sorted(CODE), default="python", help="the runs' language")
    arguments = parser.parse_args()
    print(
        f"mcp-sandbox container latency, {arguments.language}, {arguments.runs} runs per row, "
        f"Python {sys.version.split()[0]}"
    )
    anyio.run(main, arguments.runs, arguments.language)
