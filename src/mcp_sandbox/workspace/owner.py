"""Handing a workspace to another host uid: every entry the previous owner had, never through a symlink.

A root server gives each tenant's files that tenant's host uid (``mcp_sandbox.tenant_uids``); a
workspace made before that (``sandbox_uid``'s) is handed over on its first use after the
upgrade. Each entry is changed by name relative to its directory's descriptor without following
it (``lchown``), directories are entered with ``O_NOFOLLOW``, and only what the previous owner
owned changes (a hard link to someone else's file keeps its owner). Iterative, one descriptor per
level, at most :data:`MAX_DEPTH` levels: what lies deeper (only code inside could have built it)
keeps its owner, and the caller is told.
"""

from __future__ import annotations

import errno
import os
import stat

from mcp_sandbox.workspace.files import DIR_FLAGS

__all__ = ["MAX_DEPTH", "hand_over"]

MAX_DEPTH = 256


def _scan(fd: int, old_uid: int, uid: int, gid: int) -> list[str]:
    """Change what ``old_uid`` owns in directory ``fd``; return the subdirectories to enter."""
    directories: list[str] = []
    with os.scandir(fd) as entries:
        for entry in entries:
            try:
                info = entry.stat(follow_symlinks=False)
                if info.st_uid == old_uid:
                    os.chown(entry.name, uid, gid, dir_fd=fd, follow_symlinks=False)
            except FileNotFoundError:  # removed meanwhile
                continue
            if stat.S_ISDIR(info.st_mode):
                directories.append(entry.name)
    return directories


def hand_over(root_fd: int, uid: int, gid: int) -> bool:
    """Give what the owner of directory ``root_fd`` owns below it, and it, to ``uid``/``gid``.

    Returns whether every level was reached (False: a deeper part kept its owner).

    Raises:
        OSError: a directory could not be read or an entry changed.
    """
    old_uid = os.fstat(root_fd).st_uid
    complete = True
    fd = os.dup(root_fd)
    try:
        stack = [(fd, _scan(fd, old_uid, uid, gid))]
    except BaseException:
        os.close(fd)
        raise
    try:
        while stack:
            fd, pending = stack[-1]
            if not pending:
                os.close(fd)
                stack.pop()
                continue
            name = pending.pop()
            if len(stack) >= MAX_DEPTH:
                complete = False
                continue
            try:
                child = os.open(name, DIR_FLAGS, dir_fd=fd)
            except OSError as exc:
                if exc.errno in (errno.ENOENT, errno.ENOTDIR, errno.ELOOP):
                    continue  # removed, or swapped for a symlink or a file meanwhile
                raise
            try:
                stack.append((child, _scan(child, old_uid, uid, gid)))
            except BaseException:
                os.close(child)
                raise
    finally:
        for fd, _ in stack:
            os.close(fd)
    os.fchown(root_fd, uid, gid)
    return complete
