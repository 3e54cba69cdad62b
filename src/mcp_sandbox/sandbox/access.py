"""Can the sandbox's host uid reach a path? Checked before starting, so bwrap never fails late.

When the server runs as root, bwrap runs as the unprivileged sandbox uid, and every path it
binds (the runtime, the in-sandbox runner, the workspace) must be searchable by that uid all
the way down from ``/``. A checkout under ``/root`` (mode 0700) is the usual trap.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

__all__ = ["unreachable_ancestor"]


def _allows(info: os.stat_result, uid: int, gid: int, bits: int) -> bool:
    mode = info.st_mode
    if info.st_uid == uid:
        return bool(mode & (bits << 6))
    if info.st_gid == gid:
        return bool(mode & (bits << 3))
    return bool(mode & bits)


def unreachable_ancestor(path: Path, uid: int, gid: int, *, readable: bool = False) -> Path | None:
    """The first directory on the way to ``path`` that ``uid``/``gid`` cannot search, or None.

    With ``readable``, ``path`` itself must also be readable (a file) or listable (a directory).
    """
    path = path.resolve()
    for ancestor in (*reversed(path.parents), path):
        try:
            info = ancestor.stat()
        except OSError:
            return ancestor
        if stat.S_ISDIR(info.st_mode) and not _allows(info, uid, gid, 0o1):
            return ancestor
    if readable:
        info = path.stat()
        if not _allows(info, uid, gid, 0o4):
            return path
    return None
