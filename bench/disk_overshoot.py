"""How far past its quota a conversation's run gets before it is stopped, and what watching costs.

    .venv/bin/python bench/disk_overshoot.py [--backend bwrap] [--quota-mib 32] [--repeat 3]

Each attack runs as a fresh conversation run (and as a session's run) on an empty workspace with
a quota of ``--quota-mib`` MiB and 2,000 entries, writing as fast as it can:

- ``one big file``: one file, written 1 MiB at a time, up to 160 MiB;
- ``many 1 MiB files``: 1 MiB files, up to 160 of them;
- ``many small files``: empty files, up to 20,000 (the entries quota is 2,000).

Rows: the median and worst of what the workspace held when the run ended, past the quota (bytes
or entries), and how the last run ended. Every attack stops itself at 160 MiB, so an overshoot near
that figure means "not stopped in time". ``server cpu``: the server process's CPU time per second
of a run that sleeps 2 s in a conversation (the watcher alone), and of one that appends to a
file every millisecond for 2 s (the watcher woken by its writes), median of ``--repeat``.
Nothing is asserted; figures drift with the machine's load.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import tempfile
import time
from pathlib import Path

import anyio

from mcp_sandbox.config import load_settings
from mcp_sandbox.engine import Engine, ExecutionRequest
from mcp_sandbox.engine.startup import backend_for, engine_for
from mcp_sandbox.workspace import remove_tree

REPO = Path(__file__).resolve().parents[1]
RUNTIME = REPO / ".runtime" / "python"
MiB = 1 << 20
ENTRIES = 2_000

ATTACKS = {
    "one big file": """
chunk = b"x" * (1 << 20)
with open("/workspace/big", "wb") as out:
    for _ in range(160):
        out.write(chunk)
""",
    "many 1 MiB files": """
chunk = b"x" * (1 << 20)
for index in range(160):
    with open(f"/workspace/f{index}", "wb") as out:
        out.write(chunk)
""",
    "many small files": """
import os
os.mkdir("/workspace/d")
for index in range(20_000):
    os.close(os.open(f"/workspace/d/{index}", os.O_CREAT | os.O_WRONLY))
""",
}


def _held(directory: Path) -> tuple[int, int]:
    total = entries = 0
    for root, dirs, files in os.walk(directory):
        entries += len(dirs) + len(files)
        for name in files:
            total += os.lstat(os.path.join(root, name)).st_size
    return total, entries


def _fresh_workspace(root: Path, uid: int, gid: int) -> Path:
    directory = Path(tempfile.mkdtemp(dir=root))
    directory.chmod(0o700)
    if os.geteuid() == 0:
        os.chown(directory, uid, gid)
    return directory


async def _attack(engine: Engine, root: Path, code: str, *, session: str | None) -> tuple[int, int, str]:
    settings = engine.settings
    workspace = _fresh_workspace(root, settings.sandbox.sandbox_uid, settings.sandbox.sandbox_gid)
    try:
        request = ExecutionRequest(code=code, timeout=30, workspace=workspace, session=session, reset=True)
        result = await engine.execute(request)
        if session is not None:
            await engine.end_session(session)
        held, entries = _held(workspace)
        how = (result.error or result.status).split(":")[0][:40]
        return held - settings.workspaces.quota_bytes, entries - settings.workspaces.quota_files, how
    finally:
        remove_tree(workspace)


# Appends 4 KiB every millisecond for 2 s (8 MiB in all): a run that keeps writing.
WRITER = """
import time
with open("/workspace/log", "ab") as out:
    deadline = time.monotonic() + 2
    while time.monotonic() < deadline:
        out.write(b"x" * 4096)
        out.flush()
        time.sleep(0.001)
"""


async def _watch_cpu(engine: Engine, root: Path, code: str) -> float:
    workspace = _fresh_workspace(root, engine.settings.sandbox.sandbox_uid, engine.settings.sandbox.sandbox_gid)
    try:
        before = resource.getrusage(resource.RUSAGE_SELF)
        started = time.perf_counter()
        await engine.execute(ExecutionRequest(code=code, timeout=30, workspace=workspace))
        after = resource.getrusage(resource.RUSAGE_SELF)
        cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
        return cpu / (time.perf_counter() - started)
    finally:
        remove_tree(workspace)


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--backend", default="bwrap")
    parser.add_argument("--quota-mib", type=int, default=32)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as temporary:
        root = Path(temporary)
        os.chmod(root, 0o755)
        values: dict[str, object] = {
            "state_dir": str(root / "state"),
            "quota_bytes": args.quota_mib * MiB,
            "quota_files": ENTRIES,
            "pool_size": 1,
            "pool_min": 0,
        }
        if (RUNTIME / "bin" / "python3").exists():
            values["python_runtime"] = str(RUNTIME)
        settings = load_settings(env={}, flags=values)
        engine = engine_for(settings, backend_for(settings, args.backend))
        print(f"{args.backend}: quota {args.quota_mib} MiB and {ENTRIES} entries; overshoot median / worst")
        async with engine.running():
            for kind, session in (("fresh", None), ("session", "bench")):
                for name, code in ATTACKS.items():
                    runs = [await _attack(engine, root, code, session=session) for _ in range(args.repeat)]
                    if name == "many small files":
                        over = [entries for _, entries, _ in runs]
                        unit, scale = "entries", 1
                    else:
                        over = [held for held, _, _ in runs]
                        unit, scale = "MiB", MiB
                    print(
                        f"  {kind:<8} {name:<17} {statistics.median(over) / scale:8.1f} / {max(over) / scale:8.1f}"
                        f" {unit:<8} ({runs[-1][2]})"
                    )
            for what, code in (("writes nothing", "import time; time.sleep(2)"), ("appends 4 KiB/ms", WRITER)):
                cpu = [await _watch_cpu(engine, root, code) for _ in range(args.repeat)]
                print(f"  server cpu: {statistics.median(cpu) * 100:5.2f}% of a core (a 2 s run that {what})")


if __name__ == "__main__":
    anyio.run(main)
