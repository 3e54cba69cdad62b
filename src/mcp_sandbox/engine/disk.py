"""What a run may put on the host's disk: a bound that is watched while the run writes.

Where the backend can size a scratch workspace (bwrap: a tmpfs of ``scratch_size``), the kernel
bounds it and nothing here is needed. A conversation's workspace is a host directory that must
persist, and no kernel quota is available to an unprivileged server on an ordinary filesystem
(project quotas need root and a filesystem mounted with them; a loop-mounted image per
conversation needs root too), so the bound is enforced in two parts:

- ``RLIMIT_FSIZE`` (``max_file_size``, set on every sandbox): the kernel stops any one file;
- :func:`watch_disk`: while the run lives, the workspace is measured every
  :data:`WATCH_SECONDS` (longer for a workspace whose walk takes long, see :data:`WALK_SHARE`;
  bytes and directory entries, files and directories alike, so inodes are counted); a run
  that takes it over its quota is stopped and the run's error says so.

A run's overshoot is what it can write in one interval (the walk itself is bounded). A
workspace already over its quota (a quota lowered since) may not grow, but the run is not
stopped for what was there before it.
"""

from __future__ import annotations

import contextlib
import os
import stat
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import anyio
import anyio.to_thread

from mcp_sandbox.config import Settings

__all__ = ["WALK_SHARE", "WATCH_SECONDS", "DiskBound", "DiskUse", "Overrun", "disk_bound", "measure", "watch_disk"]

WATCH_SECONDS = 0.25
WALK_SHARE = 4  # pause at least this many times as long as the last walk took
_DIRECTORY_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


@dataclass(frozen=True, slots=True)
class DiskUse:
    """Bytes (``st_size`` of regular files) and directory entries below a workspace.

    ``complete`` is false when the walk stopped at its bound (then there are more entries).
    """

    bytes: int
    entries: int
    complete: bool = True


@dataclass(frozen=True, slots=True)
class DiskBound:
    """A workspace's quota: at most ``bytes`` in files and ``entries`` names (files and directories)."""

    bytes: int
    entries: int

    @classmethod
    def conversation(cls, settings: Settings) -> DiskBound:
        return cls(settings.quota_bytes, settings.quota_files)

    @classmethod
    def scratch(cls, settings: Settings) -> DiskBound:
        return cls(settings.scratch_size, settings.quota_files)

    def exceeded(self, use: DiskUse, allowed: DiskUse) -> str | None:
        """Why ``use`` is over this bound (or over ``allowed``, what was there before), or None."""
        if use.bytes > max(self.bytes, allowed.bytes):
            return f"its workspace holds {use.bytes} bytes, over the quota of {self.bytes} bytes"
        if use.entries > max(self.entries, allowed.entries) or (allowed.complete and not use.complete):
            return f"its workspace holds more than {self.entries} files and directories, its quota"
        return None


def measure(directory: Path, max_entries: int) -> DiskUse:
    """Count what ``directory`` holds, never following a symlink, looking at most at ``max_entries`` names.

    Raises:
        OSError: ``directory`` itself cannot be opened.
    """
    total = entries = 0
    pending = [os.open(directory, _DIRECTORY_FLAGS)]
    try:
        while pending:
            fd = pending.pop()
            try:
                with os.scandir(fd) as listing:
                    for entry in listing:
                        entries += 1
                        if entries > max_entries:
                            return DiskUse(total, entries, complete=False)
                        try:
                            info = entry.stat(follow_symlinks=False)
                        except OSError:  # removed meanwhile
                            continue
                        if stat.S_ISREG(info.st_mode):
                            total += info.st_size
                        elif stat.S_ISDIR(info.st_mode):
                            try:
                                pending.append(os.open(entry.name, _DIRECTORY_FLAGS, dir_fd=fd))
                            except OSError:  # closed by the run (chmod 000) or replaced: not entered
                                continue
            finally:
                os.close(fd)
    finally:
        for fd in pending:
            os.close(fd)
    return DiskUse(total, entries)


async def watch_disk(directory: Path, bound: DiskBound) -> str:
    """Measure ``directory`` until the run takes it over ``bound``; return why (run this beside the run).

    Returns only when the bound is crossed: the caller cancels it when the run ends, and stops
    the run when it returns.
    """
    limit = 2 * bound.entries + 1  # enough to see a crossing, bounded whatever the run made
    before = await anyio.to_thread.run_sync(_measure_or_empty, directory, limit)
    pause = WATCH_SECONDS
    while True:
        await anyio.sleep(pause)
        started = time.perf_counter()
        use = await anyio.to_thread.run_sync(_measure_or_empty, directory, limit)
        reason = bound.exceeded(use, before)
        if reason is not None:
            return reason
        # A big workspace takes a while to walk (~15 ms per 1,000 entries on a busy 2-core
        # host): the watch spends at most a fifth of a core on it.
        pause = max(WATCH_SECONDS, WALK_SHARE * (time.perf_counter() - started))


def _measure_or_empty(directory: Path, limit: int) -> DiskUse:
    try:
        return measure(directory, limit)
    except OSError:  # the run closed /workspace itself (chmod 000): root still reads; others see nothing
        return DiskUse(0, 0)


@dataclass
class Overrun:
    """Why :func:`disk_bound` stopped its block (None: it did not)."""

    reason: str | None = None


@contextlib.asynccontextmanager
async def disk_bound(directory: Path | None, bound: DiskBound) -> AsyncIterator[Overrun]:
    """Run the block while :func:`watch_disk` watches ``directory``; cancel the block if it crosses ``bound``.

    The block is cancelled like a timeout (its sandbox is killed on the way out); the yielded
    :class:`Overrun` then says why. ``directory`` None: nothing to watch.
    """
    overrun = Overrun()
    if directory is None:
        yield overrun
        return
    failure: Exception | None = None
    async with anyio.create_task_group() as group:

        async def watch() -> None:
            overrun.reason = await watch_disk(directory, bound)
            group.cancel_scope.cancel()

        group.start_soon(watch)
        try:
            yield overrun
        except Exception as exc:  # raised below as it is, not wrapped in the task group's ExceptionGroup
            failure = exc
        finally:
            group.cancel_scope.cancel()
    if failure is not None:
        raise failure
