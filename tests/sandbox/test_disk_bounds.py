"""What a run can put on the host's disk is bounded while it writes (issue 21, finding 6).

A run without a conversation writes into a sized scratch workspace (bwrap: a tmpfs; the kernel
says ENOSPC) or into a host directory watched by the engine (container backends: the run is
stopped). A conversation's run is stopped when its workspace goes over the byte or file quota.
Every test here writes at most a few tens of MiB.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from .harness import RunnerFactory, SandboxRunner, report_of

pytestmark = [pytest.mark.sandbox, pytest.mark.anyio]

MiB = 1 << 20


def _conversation_workspace(state_root: Path, sandbox: SandboxRunner) -> Path:
    directory = state_root / "conversation"
    directory.mkdir(mode=0o700)
    if os.geteuid() == 0:
        os.chown(directory, sandbox.settings.sandbox.sandbox_uid, sandbox.settings.sandbox.sandbox_gid)
    return directory


def _entries(directory: Path) -> int:
    return sum(len(dirs) + len(files) for _, dirs, files in os.walk(directory))


# Writes 1 MiB files, a little at a time, until 48 MiB or a refusal; reports how far it got.
_FILL = f"""
    import time
    written = 0
    def fill():
        global written
        for index in range(48):
            with open(f"/workspace/chunk-{{index}}", "wb") as out:
                out.write(b"\\1" * {MiB})
            written += {MiB}
            time.sleep(0.05)
    report["fill"] = outcome(fill)
    report["written"] = written
"""


async def test_a_scratch_workspace_cannot_hold_more_than_scratch_size(
    make_sandbox: RunnerFactory, backend_name: str
) -> None:
    sandbox = make_sandbox(scratch_size="8m", memory="256m")
    result = await sandbox.run_reporting(_FILL, time_limit=20)
    if backend_name == "bwrap":  # a tmpfs of 8 MiB: the kernel refuses the write
        assert result.status == "success", result.error
        report = report_of(result)
        assert report["fill"] == "OSError:ENOSPC"
        assert report["written"] <= 8 * MiB
    else:  # a host directory the engine watches: the run is stopped
        assert result.status == "error"
        assert result.error is not None and "quota" in result.error
        assert result.duration_ms < 20_000  # stopped, not timed out (48 chunks take ~2.5 s)


async def test_a_conversation_run_over_its_byte_quota_is_stopped(make_sandbox: RunnerFactory, state_root: Path) -> None:
    sandbox = make_sandbox(quota_bytes="8m")
    workspace = _conversation_workspace(state_root, sandbox)
    result = await sandbox.run_reporting(_FILL, time_limit=20, workspace=workspace)
    assert result.status == "error"
    assert result.error is not None and "the run was stopped" in result.error and "quota" in result.error
    # Written at ~20 MiB/s, the watch (every 0.05 s while the workspace grows) stops it within
    # a few MiB; 8 MiB allows 0.4 s of a loaded machine's delay.
    assert sum(path.stat().st_size for path in workspace.iterdir()) <= 16 * MiB


async def test_a_conversation_run_making_files_past_its_file_quota_is_stopped(
    make_sandbox: RunnerFactory, state_root: Path
) -> None:
    # The attack of the issue: 100,000 files in 3 s. Empty files and directories: inodes, no bytes.
    sandbox = make_sandbox(quota_files=500)
    workspace = _conversation_workspace(state_root, sandbox)
    result = await sandbox.run(
        """
        import time
        os.mkdir("/workspace/d")
        for index in range(100_000):
            if index % 2:
                open(f"/workspace/d/{index}", "w").close()
            else:
                os.mkdir(f"/workspace/d/dir-{index}")
        print("all made")
        time.sleep(30)
        """,
        time_limit=40,
        workspace=workspace,
    )
    assert result.status == "error"
    assert result.error is not None and "quota" in result.error
    assert "all made" not in result.stdout
    assert _entries(workspace) < 100_000


async def test_a_conversation_already_over_its_quota_may_shrink(make_sandbox: RunnerFactory, state_root: Path) -> None:
    # What was there before the run (a quota lowered since) does not stop a run that cleans up.
    sandbox = make_sandbox(quota_files=5)
    workspace = _conversation_workspace(state_root, sandbox)
    for index in range(20):
        (workspace / f"f{index}").write_bytes(b"")
    cleanup = await sandbox.run(
        """
        import time
        time.sleep(0.6)  # the engine measures the workspace a few times meanwhile
        for name in os.listdir("/workspace"):
            os.unlink(os.path.join("/workspace", name))
        print("cleaned")
        """,
        workspace=workspace,
    )
    assert (cleanup.status, cleanup.stdout) == ("success", "cleaned\n"), cleanup.error


async def test_one_huge_file_in_a_conversation_is_stopped_by_the_kernel_at_the_quota(
    make_sandbox: RunnerFactory, state_root: Path
) -> None:
    # As fast as it can, far past the quota: the kernel refuses the write that crosses what the
    # quota had left (RLIMIT_FSIZE), before the engine's watch could see it.
    sandbox = make_sandbox(quota_bytes="8m")
    workspace = _conversation_workspace(state_root, sandbox)
    (workspace / "kept").write_bytes(b"\0" * (3 * MiB))
    if os.geteuid() == 0:
        os.chown(workspace / "kept", sandbox.settings.sandbox.sandbox_uid, sandbox.settings.sandbox.sandbox_gid)
    result = await sandbox.run(
        """
        chunk = b"x" * (1 << 20)
        with open("/workspace/huge", "wb") as out:
            for _ in range(64):
                out.write(chunk)
        print("all written")
        """,
        time_limit=20,
        workspace=workspace,
    )
    assert result.status == "error"
    assert "file_size" in result.limits
    assert result.error is not None and "quota of 8 MiB" in result.error and "5 MiB" in result.error
    assert "all written" not in result.stdout
    assert (workspace / "huge").stat().st_size <= 5 * MiB


async def test_many_files_written_fast_leave_at_most_the_documented_overshoot(
    make_sandbox: RunnerFactory, state_root: Path
) -> None:
    # 160 files of 1 MiB written as fast as the page cache takes them (well under a pause of the
    # watch): each file is within the file size limit; the run is stopped, or reported over its
    # quota as it ends, and no file is larger than what the quota had left.
    sandbox = make_sandbox(quota_bytes="8m")
    workspace = _conversation_workspace(state_root, sandbox)
    result = await sandbox.run(
        """
        chunk = b"x" * (1 << 20)
        for index in range(160):
            with open(f"/workspace/f{index}", "wb") as out:
                out.write(chunk)
        """,
        time_limit=20,
        workspace=workspace,
    )
    assert result.status == "error"
    assert result.error is not None and "over the quota of 8388608 bytes" in result.error
    assert max(path.stat().st_size for path in workspace.iterdir()) <= 8 * MiB
