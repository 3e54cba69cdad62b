"""What a run may put on the host's disk: a bound that is watched while the run writes.

Where the backend can size a scratch workspace (bwrap: a tmpfs of ``scratch_size``), the kernel
bounds it and nothing here is needed. A conversation's workspace is a host directory that must
persist, and no kernel quota is available to the server (project quotas need root and a
filesystem mounted with them; a loop-mounted image per conversation needs root and a loop
device each). So the bound is enforced in two parts: ``RLIMIT_FSIZE`` on every run, the smaller
of ``max_file_size`` and what the quota has left (:meth:`Overrun.file_size`: one file cannot
take a conversation past its quota), and :func:`watch_disk`, which measures the workspace while
the run lives and stops a run that takes it over its quota. A workspace already over its quota
(a quota lowered since) may not grow, but the run is not stopped for what was there before it.
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

from mcp_sandbox.config import LimitSettings, WorkspaceSettings
from mcp_sandbox.engine.inotify import open_writes

__all__ = [
    "FILE_SIZE_FLOOR",
    "GROWING_SECONDS",
    "WALK_SHARE",
    "WATCH_SECONDS",
    "WRITE_GAP",
    "DiskBound",
    "DiskUse",
    "Overrun",
    "disk_bound",
    "measure",
    "watch_disk",
]

WATCH_SECONDS = 0.25
GROWING_SECONDS = 0.05  # the pause while the last walk saw the workspace grow
WRITE_GAP = 0.01  # woken by writes: the shortest time between two walks
FILE_SIZE_FLOOR = 64 << 10  # the smallest RLIMIT_FSIZE a run gets, however full its conversation
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
    def conversation(cls, workspaces: WorkspaceSettings) -> DiskBound:
        return cls(workspaces.quota_bytes, workspaces.quota_files)

    @classmethod
    def scratch(cls, limits: LimitSettings, workspaces: WorkspaceSettings) -> DiskBound:
        return cls(limits.scratch_size, workspaces.quota_files)

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


async def watch_disk(directory: Path, bound: DiskBound, before: DiskUse | None = None) -> str:
    """Measure ``directory`` until the run takes it over ``bound``; return why (run this beside the run).

    The workspace is measured (bytes and directory entries, files and directories alike, so
    inodes are counted) every :data:`WATCH_SECONDS`, or every :data:`GROWING_SECONDS` while it
    grows, at once (at most every :data:`WRITE_GAP`) when inotify says the run writes into its
    top directories (:mod:`.inotify`), and never more often than a fifth of a core allows (see
    :data:`WALK_SHARE`). A run's overshoot is what it can write, in many files, in one interval
    (the walk itself is bounded). The runtimes leave ``SIGXFSZ``'s default action, so a write
    past ``RLIMIT_FSIZE`` kills the process.
    ``before`` is what the workspace held when the run started (measured here when None).
    Returns only when the bound is crossed: the caller cancels it when the run ends, and stops
    the run when it returns.
    """
    limit = _walk_limit(bound)
    if before is None:
        before = await anyio.to_thread.run_sync(_measure_or_empty, directory, limit)
    writes = open_writes(directory)
    try:
        last = before
        pause = GROWING_SECONDS  # a run that writes at once is looked at soon
        earliest = 0.0  # no walk starts before this (time.monotonic())
        while True:
            if writes is None:
                await anyio.sleep(pause)
            else:  # woken by a write into the top directories, else after the pause
                await writes.wait(pause)
                if (delay := earliest - time.monotonic()) > 0:
                    await anyio.sleep(delay)
            started = time.monotonic()
            use = await anyio.to_thread.run_sync(_measure_or_empty, directory, limit)
            reason = bound.exceeded(use, before)
            if reason is not None:
                return reason
            growing = use.bytes > last.bytes or use.entries > last.entries
            last = use
            # A big workspace takes a while to walk: the watch spends at most a fifth of a core on it.
            walked = time.monotonic() - started
            earliest = time.monotonic() + max(WRITE_GAP, WALK_SHARE * walked)
            pause = max(GROWING_SECONDS if growing else WATCH_SECONDS, WALK_SHARE * walked)
    finally:
        if writes is not None:
            writes.close()


def _walk_limit(bound: DiskBound) -> int:
    return 2 * bound.entries + 1  # enough to see a crossing, bounded whatever the run made


def _measure_or_empty(directory: Path, limit: int) -> DiskUse:
    try:
        return measure(directory, limit)
    except OSError:  # the run closed /workspace itself (chmod 000): root still reads; others see nothing
        return DiskUse(0, 0)


@dataclass
class Overrun:
    """What :func:`disk_bound` saw: the workspace ``before`` the run, and why it stopped the block (None: not)."""

    bound: DiskBound
    before: DiskUse = DiskUse(0, 0)
    reason: str | None = None
    stopped: bool = False  # the block was cancelled for it (else: seen over the bound as the block ended)

    def file_size(self, max_file_size: int) -> int:
        """The run's ``RLIMIT_FSIZE``: ``max_file_size``, lowered to what the quota had left (see the module)."""
        left = self.bound.bytes - self.before.bytes
        return max(FILE_SIZE_FLOOR, min(max_file_size, left))


@contextlib.asynccontextmanager
async def disk_bound(directory: Path | None, bound: DiskBound) -> AsyncIterator[Overrun]:
    """Run the block while :func:`watch_disk` watches ``directory``; cancel the block if it crosses ``bound``.

    The workspace is measured before the block starts (``Overrun.before``: a run's file size
    limit depends on it) and once more after it ends. The block is cancelled like a timeout (its
    sandbox is killed on the way out); the yielded :class:`Overrun` then says why (``stopped``),
    or why the workspace was over its bound when the block ended. ``directory`` None: nothing
    to watch.
    """
    overrun = Overrun(bound)
    if directory is None:
        yield overrun
        return
    overrun.before = await anyio.to_thread.run_sync(_measure_or_empty, directory, _walk_limit(bound))
    failure: Exception | None = None
    async with anyio.create_task_group() as group:

        async def watch() -> None:
            overrun.reason = await watch_disk(directory, bound, overrun.before)
            overrun.stopped = True
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
    if overrun.reason is None:
        # A run that writes fast and ends within one pause was never seen: look once more.
        with anyio.CancelScope(shield=True):
            use = await anyio.to_thread.run_sync(_measure_or_empty, directory, _walk_limit(bound))
        overrun.reason = bound.exceeded(use, overrun.before)
