"""The disk watch's parts that need no sandbox: the wake-up on writes and the run's file size limit."""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest

from mcp_sandbox.engine.disk import FILE_SIZE_FLOOR, DiskBound, DiskUse, Overrun
from mcp_sandbox.engine.inotify import open_writes

pytestmark = [pytest.mark.anyio]


async def test_a_write_into_the_workspace_or_a_directory_made_there_wakes_the_watch(tmp_path: Path) -> None:
    writes = open_writes(tmp_path)
    assert writes is not None
    try:
        assert not await writes.wait(0.01)  # nothing written: the pause runs out
        (tmp_path / "d").mkdir()
        with anyio.fail_after(5):
            assert await writes.wait(60)
        (tmp_path / "d" / "f").write_bytes(b"x")  # in a directory made after the watch began
        with anyio.fail_after(5):
            assert await writes.wait(60)
        assert not await writes.wait(0.01)  # everything read
    finally:
        writes.close()


async def test_a_closed_watch_hands_its_descriptor_on_without_what_it_saw(tmp_path: Path) -> None:
    # Closing an inotify descriptor with watches blocks for a kernel grace period (~17 ms here),
    # on the event loop after every run: a closed watch keeps its descriptor for the next one.
    first, second = tmp_path / "first", tmp_path / "second"
    first.mkdir()
    second.mkdir()
    writes = open_writes(first)
    assert writes is not None
    (first / "unread").write_bytes(b"x")  # seen by nobody before the close
    fd = writes._fd
    writes.close()
    writes.close()  # twice is harmless
    again = open_writes(second)
    assert again is not None
    try:
        assert again._fd == fd
        assert not await again.wait(0.01)  # nothing of the first workspace's
        (first / "later").write_bytes(b"x")  # the first workspace is not watched any more
        assert not await again.wait(0.01)
        (second / "f").write_bytes(b"x")
        with anyio.fail_after(5):
            assert await again.wait(60)
    finally:
        again.close()


def test_a_runs_file_size_limit_is_what_the_quota_has_left_within_a_floor_and_max_file_size() -> None:
    bound = DiskBound(bytes=100 << 20, entries=10)
    assert Overrun(bound, DiskUse(30 << 20, 1)).file_size(256 << 20) == 70 << 20
    assert Overrun(bound, DiskUse(0, 0)).file_size(8 << 20) == 8 << 20
    assert Overrun(bound, DiskUse(100 << 20, 1)).file_size(256 << 20) == FILE_SIZE_FLOOR
    assert Overrun(bound, DiskUse(200 << 20, 1)).file_size(256 << 20) == FILE_SIZE_FLOOR  # over it already
