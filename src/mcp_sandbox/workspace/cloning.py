"""A copy of a conversation's directory for a fork: reflinked where the filesystem can, never following a link.

The source is the tenant's own sandbox's directory and may hold anything (see :mod:`.files`): every
step opens one name relative to the directory fd before it with ``O_NOFOLLOW``. Regular files are
cloned with ``FICLONE`` (copy-on-write: btrfs, XFS, bcachefs), else their data (holes stay holes) by
``copy_file_range`` (in-kernel copy), else read and written; directories and symlinks are made again
(a link is copied as a link, never followed); FIFOs, sockets and devices are left out, and so is
anything another uid than the source directory's owns (a hard link to someone else's file: the host
reads as root, the copy would be the tenant's). Everything made is owned by ``owner``, without
set-id bits.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import secrets
import stat
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from mcp_sandbox.errors import QuotaExceededError, WorkspaceError
from mcp_sandbox.workspace.files import DIR_FLAGS, Usage, disk_error
from mcp_sandbox.workspace.removal import remove_tree

__all__ = ["FORK_PREFIX", "CloneCounts", "clone_tree", "fork_directory"]

# A fork's directory while it is copied (in workspaces/, beside the conversations); renamed at the end.
FORK_PREFIX = ".fork-"

FICLONE = 0x40049409  # _IOW(0x94, 9, int), linux/fs.h
_CHUNK = 1 << 30


@dataclass
class CloneCounts:
    """What a clone copied: files and their bytes, and how many of them were reflinked."""

    files: int = 0
    bytes: int = 0
    reflinked: int = 0
    entries: int = 0


def _copy_data(source: int, target: int, size: int) -> bool:
    """Copy ``size`` bytes; True when they were reflinked (shared blocks until either side writes).

    Otherwise only the source's data is copied, hole by hole (``SEEK_DATA``/``SEEK_HOLE``): a
    sparse file stays sparse in the copy instead of taking its full size in blocks on every fork.
    """
    try:
        fcntl.ioctl(target, FICLONE, source)
        return True
    except OSError as exc:
        if exc.errno not in (errno.EOPNOTSUPP, errno.EXDEV, errno.EINVAL, errno.ENOTTY, errno.EPERM):
            raise
    for start, end in _data_stretches(source, size):
        _copy_range(source, target, start, end)
    os.ftruncate(target, min(size, os.fstat(source).st_size))  # a hole at the end is a size, not data
    return False


def _data_stretches(fd: int, size: int) -> Iterator[tuple[int, int]]:
    """Where the first ``size`` bytes of ``fd`` hold data, as (start, end); all of it where holes are not told."""
    offset = 0
    while offset < size:
        try:
            start = os.lseek(fd, offset, os.SEEK_DATA)
        except OSError as exc:
            if exc.errno == errno.ENXIO:  # nothing but a hole from here on
                return
            if exc.errno not in (errno.EINVAL, errno.EOPNOTSUPP):
                raise
            yield offset, size
            return
        if start >= size:
            return
        end = min(os.lseek(fd, start, os.SEEK_HOLE), size)
        yield start, end
        offset = end


def _copy_range(source: int, target: int, start: int, end: int) -> None:
    """Copy bytes ``start`` to ``end`` at the same offsets: in the kernel where it can, else read and written."""
    copied = start
    try:
        while copied < end:
            done = os.copy_file_range(source, target, min(_CHUNK, end - copied), copied, copied)
            if done == 0:  # the source shrank meanwhile
                return
            copied += done
        return
    except OSError as exc:
        if exc.errno not in (errno.EXDEV, errno.EINVAL, errno.EOPNOTSUPP, errno.ENOSYS):
            raise
    while copied < end and (chunk := os.pread(source, min(1 << 20, end - copied), copied)):
        os.pwrite(target, chunk, copied)
        copied += len(chunk)


def _copy_file(
    source_dir: int, target_dir: int, name: str, info: os.stat_result, owner: tuple[int, int] | None
) -> bool:
    source = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, dir_fd=source_dir)
    try:
        opened = os.fstat(source)
        if not stat.S_ISREG(opened.st_mode) or opened.st_uid != info.st_uid:  # swapped meanwhile
            return False
        target = os.open(
            name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=target_dir
        )
        try:
            if owner is not None:
                os.fchown(target, *owner)
            # At most the size the quota counted: a background process of the source may be writing.
            reflinked = _copy_data(source, target, info.st_size)
            os.fchmod(target, stat.S_IMODE(info.st_mode) & 0o777)
        finally:
            os.close(target)
    finally:
        os.close(source)
    return reflinked


def clone_tree(
    source: int, target: int, owner: tuple[int, int] | None, *, max_depth: int, max_entries: int, depth: int = 0
) -> CloneCounts:
    """Copy what directory fd ``source`` holds into the empty directory fd ``target``.

    Raises:
        OSError: a copy failed (a full disk); the caller removes ``target``.
        ValueError: more than ``max_entries`` entries, or deeper than ``max_depth``.
    """
    counts = CloneCounts()
    uid = os.fstat(source).st_uid
    _clone(source, target, owner, uid, counts, max_depth=max_depth, max_entries=max_entries, depth=depth)
    return counts


def _clone(
    source: int,
    target: int,
    owner: tuple[int, int] | None,
    uid: int,
    counts: CloneCounts,
    *,
    max_depth: int,
    max_entries: int,
    depth: int,
) -> None:
    with os.scandir(source) as entries:
        listed = list(entries)
    for entry in listed:
        counts.entries += 1
        if counts.entries > max_entries:
            raise ValueError(f"more than {max_entries} entries")
        try:
            info = entry.stat(follow_symlinks=False)
        except FileNotFoundError:
            continue
        name = entry.name
        if info.st_uid != uid:
            continue
        if stat.S_ISREG(info.st_mode):
            counts.reflinked += _copy_file(source, target, name, info, owner)
            counts.files += 1
            counts.bytes += info.st_size
        elif stat.S_ISLNK(info.st_mode):
            os.symlink(os.readlink(name, dir_fd=source), name, dir_fd=target)
            if owner is not None:
                os.chown(name, *owner, dir_fd=target, follow_symlinks=False)
        elif stat.S_ISDIR(info.st_mode):
            if depth + 1 > max_depth:
                raise ValueError(f"directories deeper than {max_depth} levels")
            try:
                child = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=source)
            except OSError as exc:
                if exc.errno in (errno.ENOENT, errno.ENOTDIR, errno.ELOOP):
                    continue  # removed or swapped meanwhile
                raise
            try:
                os.mkdir(name, 0o700, dir_fd=target)
                made = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=target)
                try:
                    if owner is not None:
                        os.fchown(made, *owner)
                    _clone(
                        child, made, owner, uid, counts, max_depth=max_depth, max_entries=max_entries, depth=depth + 1
                    )
                    os.fchmod(made, stat.S_IMODE(info.st_mode) & 0o777)
                finally:
                    os.close(made)
            finally:
                os.close(child)


def fork_directory(
    source: Path, target: Path, owner: tuple[int, int] | None, usage: Usage, quota: Usage, *, max_depth: int
) -> CloneCounts:
    """Copy conversation directory ``source`` to the new ``target`` (0700, ``owner``'s) through a
    temporary directory renamed into place at the end: a failure leaves nothing.

    The copies count against the fork's quota at their full size (what they may grow to, not the
    blocks they share), so a source over ``quota`` is refused before anything is copied.

    Raises:
        QuotaExceededError: ``usage`` (the source's) is over ``quota``; nothing was copied.
        WorkspaceError: ``target`` exists, or the copy failed (a full disk); nothing is left.
    """
    if usage.bytes > quota.bytes:
        raise QuotaExceededError(
            "bytes",
            usage.bytes,
            quota.bytes,
            f"it has {usage.bytes} bytes of files, over a conversation's quota of {quota.bytes}",
        )
    if usage.files > quota.files:
        raise QuotaExceededError(
            "files",
            usage.files,
            quota.files,
            f"it has {usage.files} files, over a conversation's quota of {quota.files}",
        )
    staging = target.parent / f"{FORK_PREFIX}{os.getpid()}-{secrets.token_hex(8)}"
    try:
        os.mkdir(staging, 0o700)
    except OSError as exc:
        raise disk_error(exc, "cannot create the fork's workspace") from exc
    try:
        made = os.open(staging, DIR_FLAGS)
        try:
            if owner is not None:
                os.fchown(made, *owner)
            origin = os.open(source, DIR_FLAGS)
            try:
                counts = clone_tree(origin, made, owner, max_depth=max_depth, max_entries=2 * quota.files + 1000)
            finally:
                os.close(origin)
        finally:
            os.close(made)
        if os.path.lexists(target):
            raise WorkspaceError("the conversation already exists")
        os.rename(staging, target)
    except ValueError as exc:
        _discard(staging)
        raise WorkspaceError(f"the conversation forked cannot be copied: {exc}") from exc
    except OSError as exc:
        _discard(staging)
        raise disk_error(exc, "cannot copy the conversation's files") from exc
    except BaseException:
        _discard(staging)
        raise
    return counts


def _discard(staging: Path) -> None:
    with contextlib.suppress(OSError):
        remove_tree(staging)
