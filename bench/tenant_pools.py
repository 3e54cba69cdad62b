"""A token tenant's run latency against the default tenant's: the warm and pre-started paths per host uid.

As root (where each tenant but ``default`` runs as a host uid of its own), the engine in process:
``print(1)`` in Python and a TypeScript one-liner, back to back, as ``default`` and as ``alice``.
Before per-uid pools, alice's runs each started a fresh sandbox; now they take her uid's own warm
and pre-started sandboxes. Medians, p95 and p99 in milliseconds, and the path each run took.

    sudo .venv/bin/python bench/tenant_pools.py [--count 100]
"""

from __future__ import annotations

import argparse
import collections
import os
import tempfile
import time
from pathlib import Path

import anyio

from mcp_sandbox.config import load_settings
from mcp_sandbox.engine import Engine, ExecutionRequest
from mcp_sandbox.engine.startup import backend_for, engine_for

TS = "const n: number = 6 * 7;\nconsole.log(n);"


def _line(label: str, samples: list[float], paths: collections.Counter[str]) -> None:
    ordered = sorted(samples)
    median, p95, p99 = (ordered[min(len(ordered) - 1, int(q * len(ordered)))] for q in (0.5, 0.95, 0.99))
    taken = ", ".join(f"{path} {count}" for path, count in paths.most_common())
    print(f"  {label:<36} {median:8.2f} {p95:8.2f} {p99:8.2f}  n={len(samples)}  ({taken})")


async def _timed(engine: Engine, tenant: str, language: str, code: str, count: int) -> None:
    samples: list[float] = []
    paths: collections.Counter[str] = collections.Counter()
    for _ in range(count):
        started = time.perf_counter()
        result = await engine.execute(ExecutionRequest(code=code, timeout=30, language=language, tenant=tenant))
        samples.append((time.perf_counter() - started) * 1000)
        if result.exit_code != 0:
            raise RuntimeError(f"run failed: {result}")
        paths[result.path] += 1
    _line(f"{tenant}: {language}", samples, paths)


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=100, help="runs per line")
    count = parser.parse_args().count
    if os.geteuid() != 0:
        raise SystemExit("run as root: only a root server gives tenants host uids of their own")
    with tempfile.TemporaryDirectory(prefix="mcp-sandbox-bench-") as scratch:
        os.chmod(scratch, 0o755)
        flags = {"state_dir": str(Path(scratch) / "state"), "discover_servers": False, "tenant_concurrent_runs": 2}
        settings = load_settings(env={}, flags=flags)
        engine = engine_for(settings, backend_for(settings))
        engine.prepare()
        async with engine.running():
            # Each tenant's first runs make its pools; let them fill before measuring.
            for tenant in ("default", "alice"):
                for language, code in (("python", "print(1)"), ("typescript", TS)):
                    await engine.execute(ExecutionRequest(code=code, timeout=30, language=language, tenant=tenant))
            await anyio.sleep(3.0)
            print(f"{'(ms)':<38} {'median':>8} {'p95':>8} {'p99':>8}")
            for tenant in ("default", "alice"):
                await _timed(engine, tenant, "python", "print(1)", count)
                await _timed(engine, tenant, "typescript", TS, count // 2)


if __name__ == "__main__":
    anyio.run(main)
