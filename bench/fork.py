"""A fork of a live Python conversation (pandas imported, a 1 MB, 100 MB or 1 GB workspace) against a new conversation.

Each sample is a `run_python` call end to end over stdio with the official SDK client: either
the first run of a fork (`forkFrom` a live conversation whose interpreter imported pandas and
built a DataFrame, and whose workspace holds 1 MB, 100 MB or 1 GB of files), its code using the
carried DataFrame; or, beside it in the same run, the first run of a new conversation that
imports pandas and builds the same DataFrame itself (today's way to get there). Calls are paced
(`--pause`) so the session-ready pool refills between them; idle sessions expire after 5 s and the
source is run every few seconds to stay live. The state directory is on this machine's own
filesystem (ext4 here: a fork copies every byte), and, when `mkfs.xfs` is installed and this runs
as root, the same with `workspaces.volume_bytes` (the server's reflink volume, `volume.py`: a
fork clones each file); on each, the copy alone (`WorkspaceStore.fork`, in process) is timed too,
with the bytes it put on the disk. Each size's first fork comes right after its source wrote the
files (still dirty in the page cache: a reflink writes them back first) and is shown apart; the
rest come after a `sync`, as a fork of files written long before does. `--volume-only` skips the
copied forks on the machine's own filesystem. Medians, p95, p99 in ms.
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import anyio
from mcp import Client
from mcp.client.stdio import StdioServerParameters

from mcp_sandbox.config import load_settings
from mcp_sandbox.state import StateLayout
from mcp_sandbox.tenant_uids import TenantUids
from mcp_sandbox.volume import release_volume
from mcp_sandbox.workspace import WorkspaceStore, load_secret

SETUP = "import pandas as pd\ndf = pd.DataFrame({'a': range(1000)})\n"
USE = "print(int(df.a.sum()))"
SIZES = {"1 MB": 1 << 20, "100 MB": 100 << 20, "1 GB": 1 << 30}
VOLUME_BYTES = 16 << 30  # sparse: takes what its files hold
FILE_BYTES = 128 << 20  # a workspace's files are at most this big (below max_file_size)
COPIED_1GB_RUNS = 3  # a copied fork of 1 GB writes 1 GB: fewer of them
FILL_SECONDS = 120  # writing 1 GB in a sandbox on a loaded machine can outlast the default timeout


def filling(size: int) -> str:
    """Code that fills /workspace with ``size`` bytes of random data, in files of at most FILE_BYTES.

    In a function, so that the source's variables are the DataFrame alone.
    """
    return (
        "def fill(left):\n"
        "    import os\n"
        f"    for index in range(-(-left // {FILE_BYTES})):\n"
        f"        part = min(left, {FILE_BYTES})\n"
        "        with open(f'data{index}.bin', 'wb') as file:\n"
        "            for _ in range(0, part, 1 << 20):\n"
        "                file.write(os.urandom(min(1 << 20, part)))\n"
        "        left -= part\n"
        f"fill({size})\n"
        "del fill\n"
    )


def quantiles(samples: list[float]) -> tuple[float, float, float]:
    ordered = sorted(samples)

    def at(fraction: float) -> float:
        return ordered[min(len(ordered) - 1, round(fraction * (len(ordered) - 1)))]

    return statistics.median(ordered), at(0.95), at(0.99)


def server(state_dir: Path, volume: bool) -> StdioServerParameters:
    return StdioServerParameters(
        command=sys.executable,
        args=["-m", "mcp_sandbox", "serve", "--state-dir", str(state_dir)],
        env={
            "MCP_SANDBOX_DISCOVER_SERVERS": "false",
            "MCP_SANDBOX_SESSION_TTL": "5",
            "MCP_SANDBOX_QUOTA_BYTES": str(2 << 30),
            **({"MCP_SANDBOX_VOLUME_BYTES": str(VOLUME_BYTES)} if volume else {}),
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            **{name: os.environ[name] for name in ("PYTHONPATH",) if name in os.environ},
        },
    )


async def call(client: Client, code: str, conversation: str, **arguments: Any) -> tuple[float, dict[str, Any]]:
    started = time.perf_counter()
    result = await client.call_tool("run_python", {"code": code, "conversationId": conversation, **arguments})
    elapsed = (time.perf_counter() - started) * 1000
    data: dict[str, Any] = result.structured_content or {}
    if data.get("status") != "success":
        raise RuntimeError(f"run failed: {data}")
    return elapsed, data


async def fork(client: Client, source: str, report: dict[str, Any], size_label: str) -> float:
    """A fork of ``source`` to its first result (ms); its ``fork`` field goes to ``report``."""
    elapsed, data = await call(client, USE, uuid.uuid4().hex, forkFrom=source)
    if data["stdout"] != "499500\n":
        raise RuntimeError(f"the fork did not carry the DataFrame: {data}")
    report[size_label] = data["fork"]
    return elapsed


async def measure(
    state_dir: Path, count: int, pause: float, volume: bool
) -> tuple[dict[str, list[float]], dict[str, Any]]:
    samples: dict[str, list[float]] = {"new conversation, pandas script": []}
    report: dict[str, Any] = {}
    restarts = 0
    async with Client(server(state_dir, volume)) as client:
        for _ in range(3):  # the first conversation wakes the session-ready pool; warm the server up
            await call(client, "print(0)", uuid.uuid4().hex)
            await anyio.sleep(2 * pause)
        for size_label, size in SIZES.items():
            source = uuid.uuid4().hex
            await call(client, SETUP + filling(size), source, timeout=FILL_SECONDS)
            await anyio.sleep(pause)
            # Its files still in the page cache, dirty: a reflink writes them back first.
            just_written = f"fork, {size_label} just written"
            samples[just_written] = [await fork(client, source, report, size_label)]
            await anyio.sleep(pause)
            os.sync()  # the rest fork files written back long before, as most are
            label = f"fork, {size_label} workspace"
            samples[label] = []
            for _ in range(count if volume or size < (1 << 30) else min(count, COPIED_1GB_RUNS)):
                _, kept = await call(client, "pass", source)  # keeps the source live (sessions expire after 5 s)
                if kept.get("session") != "kept":  # its session made room for another's: load it again
                    restarts += 1
                    await call(client, SETUP, source)
                await anyio.sleep(pause)
                samples[label].append(await fork(client, source, report, size_label))
                await anyio.sleep(pause)
                fresh, _ = await call(client, SETUP + USE, uuid.uuid4().hex)
                samples["new conversation, pandas script"].append(fresh)
                await anyio.sleep(pause)
    report["sources restarted"] = restarts
    return samples, report


def disk_used(path: Path) -> int:
    os.sync()
    info = os.statvfs(path)
    return (info.f_blocks - info.f_bfree) * info.f_frsize


def copies(state_dir: Path, count: int, volume: bool) -> tuple[dict[str, list[float]], dict[str, int]]:
    """The copy alone: ``WorkspaceStore.fork`` of each size (files as :func:`filling` makes them); bytes written."""
    flags: dict[str, object] = {"state_dir": str(state_dir), **({"volume_bytes": VOLUME_BYTES} if volume else {})}
    settings = load_settings(env={}, flags=flags)
    uids = TenantUids(settings.sandbox, StateLayout.of(settings.paths, settings.sandbox, settings.workspaces))
    store = WorkspaceStore(settings.workspaces, load_secret(state_dir), uids)
    store.prepare()
    samples: dict[str, list[float]] = {}
    written: dict[str, int] = {}
    block = os.urandom(1 << 20)
    for size_label, size in SIZES.items():
        source = store.key("bench", uuid.uuid4().hex)
        directory = store.ensure(source, "bench")
        owner = directory.stat()
        for index, start in enumerate(range(0, size, FILE_BYTES)):
            path = directory / f"data{index}.bin"
            with path.open("wb") as file:
                for _ in range(min(FILE_BYTES, size - start) >> 20 or 1):
                    file.write(block[: min(len(block), size)])
            os.chown(path, owner.st_uid, owner.st_gid)  # as the tenant's sandbox would have
        before = disk_used(store.root)
        copied = store.fork(source, store.key("bench", uuid.uuid4().hex), "bench")  # the first waits for writeback
        written[size_label] = disk_used(store.root) - before
        if copied.bytes != size:
            raise RuntimeError(f"the copy has {copied.bytes} bytes, not {size}")
        samples[f"the copy alone, {size_label}"] = []
        for _ in range(count if volume or size < (1 << 30) else min(count, COPIED_1GB_RUNS)):
            started = time.perf_counter()
            store.fork(source, store.key("bench", uuid.uuid4().hex), "bench")
            samples[f"the copy alone, {size_label}"].append((time.perf_counter() - started) * 1000)
    return samples, written


def filesystem(path: Path) -> str:
    found = subprocess.run(
        ["findmnt", "-n", "-o", "FSTYPE", "-T", str(path)], capture_output=True, text=True, check=False
    )
    return found.stdout.strip() or "unknown"


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10, help="forks per workspace size and filesystem")
    parser.add_argument("--pause", type=float, default=1.5, help="seconds between calls (the pool refills)")
    parser.add_argument("--volume-only", action="store_true", help="only the reflink volume, no copied forks")
    options = parser.parse_args()
    print(f"{platform.platform()}, {os.cpu_count()} CPUs, Python {platform.python_version()}")
    with tempfile.TemporaryDirectory(prefix="mcp-sandbox-bench-") as scratch:
        os.chmod(scratch, 0o755)
        kind = filesystem(Path(scratch))
        places = [] if options.volume_only else [(f"on {kind}, forks copied", False)]
        if os.geteuid() == 0 and shutil.which("mkfs.xfs") is not None:
            places.append((f"on {kind} with workspaces.volume_bytes, forks reflinked", True))
        for index, (title, volume) in enumerate(places):
            state, alone = Path(scratch) / f"state-{index}", Path(scratch) / f"copies-{index}"
            try:
                samples, report = await measure(state, options.runs, options.pause, volume)
                copied, written = copies(alone, options.runs, volume)
            finally:
                for directory in (state, alone):
                    release_volume(directory)
            samples.update(copied)
            print(f"\nstate directory {title}: first result, end to end over stdio (ms)")
            print(f"  {'':<48} {'median':>8} {'p95':>8} {'p99':>8}")
            for label, values in samples.items():
                median, p95, p99 = quantiles(values)
                print(f"  {label:<48} {median:8.2f} {p95:8.2f} {p99:8.2f}  n={len(values)}")
            print(f"  sources whose session had ended before a fork (loaded again): {report.pop('sources restarted')}")
            for size_label, fork in report.items():
                print(f"  {size_label}: {fork}; the copy alone wrote {written[size_label] / (1 << 20):.1f} MiB")


if __name__ == "__main__":
    anyio.run(main)
