"""Wake-ups when a run writes into its workspace: inotify on its top directories (see :mod:`.disk`).

The disk watch measures a workspace on a timer; a run that writes a burst right after a pause
would have the whole pause to itself. :class:`Writes` wakes the watch as soon as something is
created, written, or moved into the workspace's top directory or a directory made there (at
most :data:`MAX_WATCHES` directories: deeper writes are seen by the timer alone), through ctypes
(no binding in the standard library). Where it is unavailable (no inotify, the per-user limit on
instances reached) :func:`open_writes` gives None and the timer alone watches. Closing a
descriptor that had watches waits for the kernel's SRCU grace period, so a closed
:class:`Writes` removes its watches, reads what is left and keeps its descriptor for the next run
(at most :data:`SPARE_INSTANCES`; a descriptor beyond that is closed by a thread of its own).
"""

from __future__ import annotations

import ctypes
import os
import struct
import threading
from pathlib import Path

import anyio

__all__ = ["MAX_WATCHES", "SPARE_INSTANCES", "Writes", "open_writes"]

MAX_WATCHES = 64
SPARE_INSTANCES = 8  # idle inotify descriptors kept for the next runs (the per-user limit is 128)

_IN_MODIFY = 0x2
_IN_MOVED_TO = 0x80
_IN_CREATE = 0x100
_IN_ONLYDIR = 0x1000000
_IN_DONT_FOLLOW = 0x2000000
_IN_ISDIR = 0x40000000
_IN_NONBLOCK = os.O_NONBLOCK
_IN_CLOEXEC = os.O_CLOEXEC
_MASK = _IN_MODIFY | _IN_MOVED_TO | _IN_CREATE | _IN_ONLYDIR | _IN_DONT_FOLLOW
_EVENT = struct.Struct("iIII")  # wd, mask, cookie, len; then len bytes of name

_libc = ctypes.CDLL(None, use_errno=True)


class Writes:
    """An inotify descriptor watching a workspace's top directories; close it when done."""

    def __init__(self, fd: int, top: Path) -> None:
        self._fd = fd
        self._top = os.fsencode(top)
        self._directories: dict[int, bytes] = {}
        self._add(self._top)

    def _add(self, path: bytes) -> None:
        if len(self._directories) >= MAX_WATCHES:
            return
        wd = _libc.inotify_add_watch(self._fd, path, _MASK)
        if wd >= 0:
            self._directories[wd] = path

    async def wait(self, seconds: float) -> bool:
        """Wait up to ``seconds`` for writes; True if there were (all read so far are taken)."""
        with anyio.move_on_after(seconds):
            await anyio.wait_readable(self._fd)
        return self._drain()

    def _drain(self) -> bool:
        seen = False
        while True:
            try:
                data = os.read(self._fd, 64 * 1024)
            except BlockingIOError:
                return seen
            seen = True
            offset = 0
            while offset + _EVENT.size <= len(data):
                wd, mask, _, length = _EVENT.unpack_from(data, offset)
                name = data[offset + _EVENT.size : offset + _EVENT.size + length].rstrip(b"\0")
                offset += _EVENT.size + length
                parent = self._directories.get(wd)
                if mask & _IN_CREATE and mask & _IN_ISDIR and parent == self._top:
                    self._add(parent + b"/" + name)

    def close(self) -> None:
        """Stop watching; the descriptor is kept for another workspace (see the module docstring)."""
        fd, self._fd = self._fd, -1
        if fd < 0:
            return
        for wd in self._directories:
            _libc.inotify_rm_watch(fd, wd)
        self._directories.clear()
        try:
            while os.read(fd, 64 * 1024):  # the removals' IN_IGNORED, and writes not read yet
                pass
        except BlockingIOError:
            pass
        with _spare_lock:
            if len(_spare) < SPARE_INSTANCES:
                _spare.append(fd)
                return
        threading.Thread(target=os.close, args=(fd,), name="inotify-close", daemon=True).start()


_spare: list[int] = []  # inotify descriptors without watches, for the next open_writes()
_spare_lock = threading.Lock()


def open_writes(top: Path) -> Writes | None:
    """Watch ``top`` (a workspace) for writes; None where inotify is unavailable (the timer alone watches)."""
    with _spare_lock:
        fd = _spare.pop() if _spare else -1
    if fd < 0:
        fd = _libc.inotify_init1(_IN_NONBLOCK | _IN_CLOEXEC)
    if fd < 0:  # EMFILE (the per-user limit on instances), ENOSYS, ENOMEM
        return None
    return Writes(fd, top)
