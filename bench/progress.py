"""What progress notifications cost a run: the same programs with and without an output listener.

Each program runs in a fresh sandbox on one engine, alternately without a listener and with the
server's :class:`~mcp_sandbox.server.tools.progress.ProgressLines` (its notifications sent to a no-op,
as a client that reads fast would take them):

- quiet: one line, then 0.5 s of sleep (the cost when there is little to report);
- flood: 200,000 short lines as fast as Python prints them (the pacing's worst case).

Medians in milliseconds, the ratio with / without, and how many notifications the flood sent.
Nothing is asserted; numbers drift +-30% between runs on a shared 2-core machine.

Run: `.venv/bin/python bench/progress.py [--runs N]`.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

import anyio

from mcp_sandbox import load_settings
from mcp_sandbox.engine import Engine, ExecutionRequest
from mcp_sandbox.engine.startup import backend_for, engine_for
from mcp_sandbox.server.tools.progress import ProgressLines
from mcp_sandbox.workspace import remove_tree

_REPO = Path(__file__).resolve().parents[1]
PROGRAMS = {
    "quiet": "import time\nprint('working', flush=True)\ntime.sleep(0.5)\n",
    "flood": "import sys\nsys.stdout.writelines(f'line {i}\\n' for i in range(200_000))\n",
}


async def _timed(engine: Engine, code: str, progress: bool) -> tuple[float, int]:
    sent = 0

    async def send(value: float, message: str) -> None:
        nonlocal sent
        sent += 1

    started = time.perf_counter()
    if progress:
        async with ProgressLines(send).running() as listener:
            result = await engine.execute(ExecutionRequest(code=code, timeout=60, on_output=listener))
    else:
        result = await engine.execute(ExecutionRequest(code=code, timeout=60))
    elapsed = (time.perf_counter() - started) * 1000
    if result.status != "success":
        raise SystemExit(f"run failed: {result.status} {result.error} {result.stderr}")
    return elapsed, sent


async def _measure(engine: Engine, runs: int) -> None:
    async with engine.running():
        for name, code in PROGRAMS.items():
            without: list[float] = []
            with_progress: list[float] = []
            notifications: list[int] = []
            await _timed(engine, code, False)  # warm-up: caches, first sandbox
            for _ in range(runs):
                without.append((await _timed(engine, code, False))[0])
                elapsed, sent = await _timed(engine, code, True)
                with_progress.append(elapsed)
                notifications.append(sent)
            plain, reported = statistics.median(without), statistics.median(with_progress)
            print(
                f"{name:<6} without {plain:8.1f}  with progress {reported:8.1f}  "
                f"ratio {reported / plain:5.2f}x  notifications (median) {statistics.median(notifications):.0f}"
            )


def main(runs: int) -> None:
    state = Path(tempfile.mkdtemp(prefix="mcp-sandbox-bench-"))
    state.chmod(0o711)
    flags: dict[str, object] = {"state_dir": str(state / "state")}
    runtime_dir = _REPO / ".runtime" / "python"
    if (runtime_dir / "bin" / "python3").exists():
        flags["python_runtime"] = str(runtime_dir)
    try:
        settings = load_settings(env={}, flags=flags)
        print(f"{runs} runs each; milliseconds; {os.cpu_count()} CPUs")
        anyio.run(_measure, engine_for(settings, backend_for(settings)), runs)
    finally:
        remove_tree(state)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10)
    main(parser.parse_args().runs)
