"""Removing a tree that sandboxed code built, whatever it built.

``shutil.rmtree`` recurses (a 3,000-deep tree raises RecursionError on 3.11) and needs paths
that a deep tree makes longer than PATH_MAX. Here every operation is relative to a directory
fd with a single name: each subdirectory is first moved up to the top of the tree, so the
depth never exceeds one, and modes the code set (``chmod 000``) are opened up before use.
Symlinks are unlinked, never followed. Call it only once the sandbox is dead, so nothing
races the walk.
"""

from __future__ import annotations

import contextlib
import errno
import itertools
import os
import uuid
from pathlib import Path

__all__ = ["remove_tree"]

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def _empty(name: str, top: int, prefix: str, counter: itertools.count[int], pending: list[str]) -> None:
    """Unlink the non-directories in ``name`` and move its subdirectories up to ``top``."""
    fd = os.open(name, _DIR_FLAGS, dir_fd=top)
    try:
        with os.scandir(fd) as entries:
            victims = [(entry.name, entry.is_dir(follow_symlinks=False)) for entry in entries]
        for child, is_dir in victims:
            if not is_dir:
                os.unlink(child, dir_fd=fd)
                continue
            # Moving a directory rewrites its "..": it needs w. chmod by name would follow a symlink
            # swapped in since the scan (Python refuses follow_symlinks=False with dir_fd), so the
            # mode is set through an O_PATH descriptor that cannot be a symlink's target.
            try:
                child_fd = os.open(child, os.O_PATH | os.O_NOFOLLOW | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=fd)
            except OSError as exc:
                if exc.errno not in (errno.ENOTDIR, errno.ELOOP):
                    raise
                os.unlink(child, dir_fd=fd)  # no longer a directory: a symlink or file swapped in
                continue
            try:
                os.chmod(f"/proc/self/fd/{child_fd}", 0o700)
            finally:
                os.close(child_fd)
            moved = f"{prefix}{next(counter)}"
            os.rename(child, moved, src_dir_fd=fd, dst_dir_fd=top)
            pending.append(moved)
    finally:
        os.close(fd)


def remove_tree(root: Path) -> None:
    """Delete ``root`` and everything below it. A missing ``root`` is not an error.

    Raises:
        OSError: something could not be removed (the tree is left partly removed).
    """
    try:
        os.chmod(root, 0o700, follow_symlinks=False)
        top = os.open(root, _DIR_FLAGS)
    except FileNotFoundError:
        return
    except NotADirectoryError:
        os.unlink(root)
        return
    prefix = f".mcp-sandbox-removing-{uuid.uuid4().hex}-"
    counter = itertools.count()
    try:
        pending: list[str] = []
        _empty(".", top, prefix, counter, pending)
        while pending:
            name = pending.pop()
            _empty(name, top, prefix, counter, pending)
            os.rmdir(name, dir_fd=top)
    finally:
        os.close(top)
    with contextlib.suppress(FileNotFoundError):
        os.rmdir(root)
