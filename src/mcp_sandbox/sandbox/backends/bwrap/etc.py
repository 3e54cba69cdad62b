"""The sandbox's ``/etc`` as one bind mount: a copy of the host entries it shows, kept in step.

A sandbox sees eight entries of the host's ``/etc`` and a ``hosts`` of its own
(:mod:`mcp_sandbox.sandbox.hostfs`). Bound one by one, they cost bwrap nine reads of
``/proc/self/mountinfo`` (it parses the whole mount table after every bind), so the backend
copies the entries into ``runs/<pid>-etc-<hex>/`` in the state directory and binds that at
``/etc`` (bench/README.md has the figures). The sandbox sees
what the binds showed: symlinks on the host followed at the top, kept inside directories; modes
kept less setuid, setgid and sticky bits. No start waits for the copy: it is bound only while
the host's entries were walked less than :data:`CHECK_INTERVAL` seconds ago and found as
copied; otherwise the start binds the entries one by one and has a walk, and if anything
changed a new copy, made in a worker thread. When no copy can be made, the entries are bound
one by one, with a warning (once, until a copy is made again).
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import shutil
import stat
import threading
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import anyio
import anyio.to_thread
from anyio.abc import TaskGroup

from mcp_sandbox.state import StateLayout

__all__ = ["CHECK_INTERVAL", "Entries", "EtcCopies"]

logger = logging.getLogger(__name__)

CHECK_INTERVAL = 2.0  # seconds between two walks of the host's entries (each on a start)
_ATTEMPTS = 3  # copies taken while the host kept changing before giving up (then: binds)

# (host path, target under /etc): the policy's read-only system mounts a copy stands for.
Entries = tuple[tuple[str, str], ...]
# What a walk saw: per path, its kind, inode, device, mode, size, mtime and ctime.
_Fingerprint = tuple[tuple[str, int, int, int, int, int, int], ...]


@dataclass(frozen=True, slots=True)
class _Copy:
    entries: Entries
    seen: _Fingerprint
    directory: Path


class _Stopped(Exception):
    """The backend is stopping: a copy in progress gives up."""


class EtcCopies:
    """The current copy of a policy's host ``/etc`` entries, made and refreshed in the background.

    A walk is an ``lstat`` of each entry; when anything differs (inode, mode, size, mtime or
    ctime) a new copy is made, checked against the host once more (a copy taken while the host
    was changing is made again), and bound by the starts from then on. The first start of a
    backend makes no copy: one that starts a single sandbox (``mcp-sandbox run``) would only
    throw it away. A copy stays until the backend stops, since sandboxes started from it may
    still run; a copy being made then gives up at its next entry. A sandbox started ahead of its
    run (a warm or pre-started one) keeps what it was started with.
    """

    def __init__(self, layout: StateLayout) -> None:
        self._layout = layout
        self._current: _Copy | None = None
        self._checked = -math.inf
        self._checking = False
        self._failing = False
        self._asked = 0
        self._made: list[Path] = []
        self._group: TaskGroup | None = None
        self._stop = threading.Event()

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        """Make and refresh copies during this block; on the way out, stop and remove them all.

        No sandbox started from a copy may run past the block.
        """
        try:
            async with anyio.create_task_group() as group:
                self._group = group
                try:
                    yield
                finally:
                    self._stop.set()  # a copy being made gives up at its next entry
                    group.cancel_scope.cancel()
        finally:
            self._group, self._stop = None, threading.Event()
            made, self._made, self._current = self._made, [], None
            self._checked, self._asked = -math.inf, 0
            for directory in made:
                shutil.rmtree(directory, ignore_errors=True)  # ours: nothing else writes there

    def directory(self, entries: Entries) -> Path | None:
        """The directory to bind at ``/etc`` for ``entries``, or None: bind them one by one.

        The copy, if it was made for ``entries`` and the host's entries were walked less than
        :data:`CHECK_INTERVAL` ago. Otherwise the entries are bound one by one, which shows
        them as they are, and a walk (and a copy, if they changed) starts in the background
        -- from the second start on: a backend that starts one sandbox (``mcp-sandbox run``)
        never copies.
        """
        current = self._current
        if (
            current is not None
            and current.entries == entries
            and not self._checking
            and time.monotonic() - self._checked < CHECK_INTERVAL
        ):
            return current.directory
        self._asked += 1
        if self._group is not None and not self._checking and self._asked > 1:
            self._checking = True
            self._group.start_soon(self._check, entries, current)
        return None

    async def _check(self, entries: Entries, current: _Copy | None) -> None:
        started = time.monotonic()  # what the copy shows is the host as of then, or later
        try:
            self._current = await anyio.to_thread.run_sync(self._refreshed, entries, current)
        except _Stopped:
            return
        except OSError as exc:
            if not self._failing:  # once, not on every look while it lasts
                logger.warning("binding the host's /etc entries one by one: they could not be copied: %s", exc)
            self._failing = True
            self._current = None
        else:
            self._failing = False
        finally:
            self._checked, self._checking = started, False

    def _refreshed(self, entries: Entries, current: _Copy | None) -> _Copy:
        """``current`` if the host's entries are as it saw them, else a new copy (in a worker thread).

        Raises:
            OSError: no copy could be made, or the host kept changing while it was copied.
            _Stopped: the backend is stopping.
        """
        for _ in range(_ATTEMPTS):
            seen = _walk(entries)
            if current is not None and current.entries == entries and current.seen == seen:
                return current
            directory = self._layout.new_etc_copy()
            self._made.append(directory)
            for source, target in entries:
                _copy_entry(source, directory / target.removeprefix("/etc/"), self._stop)
            directory.chmod(0o755)  # open to the sandbox only once complete
            if _walk(entries) == seen:
                return _Copy(entries, seen, directory)
        raise OSError(f"the host's /etc entries changed during each of {_ATTEMPTS} copies")


def _walk(entries: Entries) -> _Fingerprint:
    seen: list[tuple[str, int, int, int, int, int, int]] = []

    def visit(path: str, info: os.stat_result) -> None:
        seen.append((path, info.st_ino, info.st_dev, info.st_mode, info.st_size, info.st_mtime_ns, info.st_ctime_ns))
        if stat.S_ISDIR(info.st_mode):
            with os.scandir(path) as listing:
                for entry in sorted(listing, key=lambda e: e.name):
                    visit(entry.path, entry.stat(follow_symlinks=False))

    for source, _ in entries:
        try:
            visit(source, os.stat(source))  # followed, as a bind follows it
        except FileNotFoundError:
            seen.append((source, 0, 0, 0, 0, 0, 0))
    return tuple(seen)


def _copy_entry(source: str, target: Path, stop: threading.Event) -> None:
    """Copy host entry ``source`` (followed if a symlink) to ``target``; a missing one is left out.

    Raises:
        _Stopped: ``stop`` was set (checked before each entry).
    """
    resolved = os.path.realpath(source)
    try:
        info = os.stat(resolved)
    except FileNotFoundError:
        return
    target.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
    _copy(resolved, target, info, stop)


def _copy(source: str, target: Path, info: os.stat_result, stop: threading.Event) -> None:
    if stop.is_set():
        raise _Stopped
    mode = stat.S_IMODE(info.st_mode) & 0o777
    if stat.S_ISLNK(info.st_mode):
        os.symlink(os.readlink(source), target)
    elif stat.S_ISDIR(info.st_mode):
        target.mkdir(mode=0o700)
        with os.scandir(source) as listing:
            for entry in listing:
                _copy(entry.path, target / entry.name, entry.stat(follow_symlinks=False), stop)
        target.chmod(mode)
    elif stat.S_ISREG(info.st_mode):
        _copy_file(source, target, mode)


def _copy_file(source: str, target: Path, mode: int) -> None:
    # Opened without following a link and without blocking, and checked again once open: what
    # is copied is the regular file that was listed, never a FIFO or a device put in its place.
    fd = os.open(source, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return
        with open(fd, "rb", closefd=False) as reading, open(target, "xb") as writing:
            shutil.copyfileobj(reading, writing)
        target.chmod(mode)
    finally:
        os.close(fd)
