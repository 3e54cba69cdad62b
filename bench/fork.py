"""A fork of a live Python conversation (pandas imported, a 1 MB or 100 MB workspace) against a new conversation.

Each sample is a `run_python` call end to end over stdio with the official SDK client: either
the first run of a fork (`forkFrom` a live conversation whose interpreter imported pandas and
built a DataFrame, and whose workspace holds one file of 1 MB or 100 MB), its code using the
carried DataFrame; or, beside it in the same run, the first run of a new conversation that
imports pandas and builds the same DataFrame itself (today's way to get there). Calls are paced
(`--pause`) so the session-ready pool refills between them; idle sessions expire after 5 s and the
source is run every few seconds to stay live. The state directory is on this machine's own
filesystem, and, when `mkfs.xfs` is installed and this runs as root, also on a loop-mounted XFS
with reflinks (`FICLONE`): the copy's cost with and without copy-on-write; on each, the copy
alone (`WorkspaceStore.fork`, in process) is timed too. Medians, p95, p99 in ms.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
from mcp import Client
from mcp.client.stdio import StdioServerParameters

from mcp_sandbox.config import load_settings
from mcp_sandbox.workspace import WorkspaceStore, load_secret

SETUP = "import pandas as pd\ndf = pd.DataFrame({'a': range(1000)})\n"
USE = "print(int(df.a.sum()))"
SIZES = {"1 MB": 1 << 20, "100 MB": 100 << 20}


def quantiles(samples: list[float]) -> tuple[float, float, float]:
    ordered = sorted(samples)

    def at(fraction: float) -> float:
        return ordered[min(len(ordered) - 1, round(fraction * (len(ordered) - 1)))]

    return statistics.median(ordered), at(0.95), at(0.99)


def server(state_dir: Path) -> StdioServerParameters:
    return StdioServerParameters(
        command=sys.executable,
        args=["-m", "mcp_sandbox", "serve", "--state-dir", str(state_dir)],
        env={
            "MCP_SANDBOX_DISCOVER_SERVERS": "false",
            "MCP_SANDBOX_SESSION_TTL": "5",
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


async def measure(state_dir: Path, count: int, pause: float) -> tuple[dict[str, list[float]], dict[str, Any]]:
    samples: dict[str, list[float]] = {"new conversation, pandas script": []}
    report: dict[str, Any] = {}
    async with Client(server(state_dir)) as client:
        for _ in range(3):  # the first conversation wakes the session-ready pool; warm the server up
            await call(client, "print(0)", uuid.uuid4().hex)
            await anyio.sleep(2 * pause)
        for size_label, size in SIZES.items():
            source = uuid.uuid4().hex
            write = f"import os\nopen('data.bin', 'wb').write(os.urandom({size}))\n"
            await call(client, SETUP + write, source)
            await anyio.sleep(pause)
            label = f"fork, {size_label} workspace"
            samples[label] = []
            for _ in range(count):
                await call(client, "pass", source)  # keeps the source live (sessions expire after 5 s)
                await anyio.sleep(pause)
                elapsed, data = await call(client, USE, uuid.uuid4().hex, forkFrom=source)
                if data["stdout"] != "499500\n":
                    raise RuntimeError(f"the fork did not carry the DataFrame: {data}")
                samples[label].append(elapsed)
                report[size_label] = data["fork"]
                await anyio.sleep(pause)
                fresh, _ = await call(client, SETUP + USE, uuid.uuid4().hex)
                samples["new conversation, pandas script"].append(fresh)
                await anyio.sleep(pause)
    return samples, report


def copies(state_dir: Path, count: int) -> dict[str, list[float]]:
    """The copy alone: ``WorkspaceStore.fork`` of a workspace holding one file of each size."""
    settings = load_settings(env={}, flags={"state_dir": str(state_dir)})
    store = WorkspaceStore(settings, load_secret(state_dir))
    store.prepare()
    samples: dict[str, list[float]] = {}
    for size_label, size in SIZES.items():
        source = store.key("bench", uuid.uuid4().hex)
        directory = store.ensure(source, "bench")
        (directory / "data.bin").write_bytes(os.urandom(size))
        owner = directory.stat()
        os.chown(directory / "data.bin", owner.st_uid, owner.st_gid)  # as the tenant's sandbox would have
        copied = store.fork(source, store.key("bench", uuid.uuid4().hex), "bench")  # the first waits for writeback
        if copied.bytes != size:
            raise RuntimeError(f"the copy has {copied.bytes} bytes, not {size}")
        samples[f"the copy alone, {size_label}"] = []
        for _ in range(count):
            started = time.perf_counter()
            store.fork(source, store.key("bench", uuid.uuid4().hex), "bench")
            samples[f"the copy alone, {size_label}"].append((time.perf_counter() - started) * 1000)
    return samples


@contextlib.contextmanager
def xfs_with_reflinks(scratch: Path) -> Iterator[Path | None]:
    """A loop-mounted XFS (reflink=1) under ``scratch``, or None where it cannot be made."""
    if os.geteuid() != 0 or shutil.which("mkfs.xfs") is None:
        yield None
        return
    image, mount = scratch / "xfs.img", scratch / "xfs"
    mount.mkdir()
    with image.open("wb") as file:
        file.truncate(6 << 30)
    subprocess.run(["mkfs.xfs", "-q", "-m", "reflink=1", str(image)], check=True)
    subprocess.run(["mount", "-o", "loop", str(image), str(mount)], check=True)
    try:
        os.chmod(mount, 0o755)
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)
        image.unlink()


def filesystem(path: Path) -> str:
    found = subprocess.run(
        ["findmnt", "-n", "-o", "FSTYPE", "-T", str(path)], capture_output=True, text=True, check=False
    )
    return found.stdout.strip() or "unknown"


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10, help="forks per workspace size and filesystem")
    parser.add_argument("--pause", type=float, default=1.5, help="seconds between calls (the pool refills)")
    options = parser.parse_args()
    print(f"{platform.platform()}, {os.cpu_count()} CPUs, Python {platform.python_version()}")
    with tempfile.TemporaryDirectory(prefix="mcp-sandbox-bench-") as scratch:
        os.chmod(scratch, 0o755)
        with xfs_with_reflinks(Path(scratch)) as xfs:
            places = [Path(scratch)] + ([xfs] if xfs is not None else [])
            for place in places:
                samples, report = await measure(place / "state", options.runs, options.pause)
                samples.update(copies(place / "copies", options.runs))
                kind = filesystem(place)
                print(f"\nstate directory on {kind}: first result, end to end over stdio (ms)")
                print(f"  {'':<48} {'median':>8} {'p95':>8} {'p99':>8}")
                for label, values in samples.items():
                    median, p95, p99 = quantiles(values)
                    print(f"  {label:<48} {median:8.2f} {p95:8.2f} {p99:8.2f}  n={len(values)}")
                for size_label, fork in report.items():
                    print(f"  {size_label}: {fork}")


if __name__ == "__main__":
    anyio.run(main)
