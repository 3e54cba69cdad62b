"""Latency of TypeScript/JavaScript runs, per runtime (bun, deno), against Python's and the bare runtime.

For each installed runtime, with a small TypeScript program (`const n: number = 6 * 7; console.log(n)`):

- bare: the runtime alone on the host, no sandbox (`bun run hello.ts`, `deno run hello.ts`);
- cold: the first run of a new engine (a new backend: cgroup detection, first sandbox);
- fresh: later runs of the same engine, not running its pools: a fresh bwrap sandbox per run;
- warm: runs of a running engine, each in a pre-started single-use sandbox (`prestart_size`,
  see `engine/prestart.py`), back to back and 0.1 s apart (the pool refills in the background;
  back to back, a run may wait for a sandbox still starting);
- on a workspace: runs of a running engine on a conversation's workspace, 0.1 s apart: no
  pre-started sandbox serves them, so each starts a fresh sandbox, from a first process the
  running backend admitted to its cgroups ahead (see ``BwrapBackend.running``).

Python is measured the same way for comparison (its warm runs fork from a zygote). Medians and
p95 in milliseconds, then ratios. Nothing is asserted; absolute numbers drift +-30% between runs
on a shared 2-core machine.

Run: `.venv/bin/python bench/js_latency.py [--runs N]`.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import anyio

from mcp_sandbox import load_settings
from mcp_sandbox.config import JS_RUNTIMES, Settings
from mcp_sandbox.engine import Engine, ExecutionRequest
from mcp_sandbox.engine.runtimes import js_binary
from mcp_sandbox.engine.startup import backend_for, engine_for
from mcp_sandbox.workspace import remove_tree

_REPO = Path(__file__).resolve().parents[1]
_TS = "const n: number = 6 * 7;\nconsole.log(n);\n"
_PY = "print(6 * 7)\n"


def _p95(samples: list[float]) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))]


def _bare(runtime: str, settings: Settings, runs: int) -> list[float]:
    binary = str(js_binary(settings.paths, runtime))
    with tempfile.TemporaryDirectory() as scratch:
        script = Path(scratch) / "hello.ts"
        script.write_text(_TS)
        command = [binary, "run", "--quiet", str(script)] if runtime == "deno" else [binary, "run", str(script)]
        environment = {"PATH": "/usr/bin:/bin", "HOME": scratch, "DENO_DIR": f"{scratch}/deno", "NO_COLOR": "1"}
        samples = []
        for _ in range(runs):
            started = time.perf_counter()
            subprocess.run(command, env=environment, capture_output=True, check=True)
            samples.append((time.perf_counter() - started) * 1000)
    return samples


async def _engine_runs(settings: Settings, language: str, code: str, runs: int) -> tuple[list[float], list[float]]:
    """(cold, fresh): the first run of each of ``runs`` new engines, then ``runs`` more on the last."""
    engines = [engine_for(settings, backend_for(settings)) for _ in range(runs)]
    cold = [await _timed(engine, language, code) for engine in engines]
    fresh = [await _timed(engines[-1], language, code) for _ in range(runs)]
    return cold, fresh


async def _warm_runs(settings: Settings, language: str, code: str, runs: int, pause: float) -> list[float]:
    """``runs`` runs of a running engine (its pools on), ``pause`` seconds apart, after a few to fill the pools."""
    async with engine_for(settings, backend_for(settings)).running() as engine:
        for _ in range(3):
            await _timed(engine, language, code)
            await anyio.sleep(1.0)
        samples = []
        for _ in range(runs):
            samples.append(await _timed(engine, language, code, warm=True))
            await anyio.sleep(pause)
        return samples


async def _workspace_runs(settings: Settings, language: str, code: str, runs: int) -> list[float]:
    """``runs`` runs of a running engine on a conversation's workspace, 0.1 s apart, after a few."""
    async with engine_for(settings, backend_for(settings)).running() as engine:
        with tempfile.TemporaryDirectory(prefix="mcp-sandbox-bench-workspace-") as workspace:
            os.chmod(workspace, 0o777)  # the sandbox's uid writes there
            samples = []
            for index in range(runs + 3):
                took = await _timed(engine, language, code, workspace=Path(workspace))
                if index >= 3:
                    samples.append(took)
                await anyio.sleep(0.1)
    return samples


async def _timed(
    engine: Engine, language: str, code: str, *, warm: bool = False, workspace: Path | None = None
) -> float:
    started = time.perf_counter()
    request = ExecutionRequest(
        code=code, timeout=engine.settings.limits.timeout, language=language, workspace=workspace
    )
    result = await engine.execute(request)
    elapsed = (time.perf_counter() - started) * 1000
    if result.status != "success" or result.stdout != "42\n":
        raise SystemExit(f"{language} run failed: {result.status} {result.error} {result.stderr}")
    if warm and not result.warm:
        print(f"  ({language}: a run found no warm sandbox ready)")
    return elapsed


def _row(name: str, samples: list[float]) -> str:
    return f"{name:<28} {statistics.median(samples):8.1f} {_p95(samples):8.1f}"


def main(runs: int) -> None:
    state = Path(tempfile.mkdtemp(prefix="mcp-sandbox-bench-"))
    state.chmod(0o711)
    flags: dict[str, object] = {"state_dir": str(state / "state")}
    runtime_dir = _REPO / ".runtime" / "python"
    if (runtime_dir / "bin" / "python3").exists():
        flags["python_runtime"] = str(runtime_dir)
    try:
        base = load_settings(env={}, flags=flags)
        medians: dict[str, float] = {}
        print(f"{runs} runs each; milliseconds; {os.cpu_count()} CPUs; Python {sys.version.split()[0]}")
        print(f"{'':<28} {'median':>8} {'p95':>8}")
        cold, fresh = anyio.run(_engine_runs, base, "python", _PY, runs)
        print(_row("python, cold sandbox", cold))
        print(_row("python, fresh sandbox", fresh))
        print(_row("python, warm (zygote)", anyio.run(_warm_runs, base, "python", _PY, runs, 0.1)))
        print(_row("python, on a workspace", anyio.run(_workspace_runs, base, "python", _PY, runs)))
        medians["python"] = statistics.median(fresh)
        for runtime in JS_RUNTIMES:
            settings = load_settings(env={}, flags={**flags, "js_runtime": runtime})
            if not os.access(js_binary(settings.paths, runtime), os.X_OK):
                print(f"{runtime}: not installed at {js_binary(settings.paths, runtime)} (make runtime)")
                continue
            bare = _bare(runtime, settings, runs)
            cold, fresh = anyio.run(_engine_runs, settings, "typescript", _TS, runs)
            warm = anyio.run(_warm_runs, settings, "typescript", _TS, runs, 0.1)
            back_to_back = anyio.run(_warm_runs, settings, "typescript", _TS, runs, 0.0)
            on_workspace = anyio.run(_workspace_runs, settings, "typescript", _TS, runs)
            print(_row(f"{runtime}, bare (no sandbox)", bare))
            print(_row(f"{runtime}, cold sandbox", cold))
            print(_row(f"{runtime}, fresh sandbox", fresh))
            print(_row(f"{runtime}, warm, 0.1 s apart", warm))
            print(_row(f"{runtime}, warm, back to back", back_to_back))
            print(_row(f"{runtime}, on a workspace", on_workspace))
            medians[runtime] = statistics.median(fresh)
            medians[f"{runtime}-warm"] = statistics.median(warm)
            medians[f"{runtime}-bare"] = statistics.median(bare)
        print()
        for runtime in JS_RUNTIMES:
            if runtime in medians:
                sandboxed = medians[runtime] / medians[f"{runtime}-bare"]
                versus = medians[runtime] / medians["python"]
                warm_ratio = medians[runtime] / medians[f"{runtime}-warm"]
                print(
                    f"{runtime}: fresh sandbox / bare {sandboxed:.2f}x; vs python's fresh run {versus:.2f}x; "
                    f"fresh / warm {warm_ratio:.1f}x"
                )
        if "bun" in medians and "deno" in medians:
            print(f"deno / bun (fresh sandbox): {medians['deno'] / medians['bun']:.2f}x")
    finally:
        remove_tree(state)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20)
    main(parser.parse_args().runs)
