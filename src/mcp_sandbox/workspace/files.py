"""File-descriptor-relative operations inside a directory that sandboxed code also writes.

Sandboxed code can put anything in its workspace, at any moment: symlinks to ``/etc/shadow``,
FIFOs, sockets, 3,000-deep trees, ``chmod 000`` directories, names that are not UTF-8. So the
host never resolves a path through it: every step opens one name relative to the directory fd
of the step before, with ``O_NOFOLLOW``, and a directory swapped for a symlink after a check
fails the open instead of leading out (there is no check-then-use gap to race). Nothing here
changes what the code made, except the files the host writes itself.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

from mcp_sandbox.errors import DiskFullError, ValidationError, WorkspaceError
from mcp_sandbox.workspace.names import MAX_COMPONENTS, check_filename

__all__ = [
    "DIR_FLAGS",
    "DISK_FULL",
    "FileEntry",
    "Listing",
    "OpenFile",
    "Usage",
    "Walk",
    "disk_error",
    "open_file_in",
    "open_parent",
    "open_regular",
    "unlink_in",
]

DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_OWNER_RX = stat.S_IRUSR | stat.S_IXUSR


@dataclass(frozen=True, slots=True)
class FileEntry:
    """A regular file in a workspace: its name (relative POSIX path), size in bytes and mtime."""

    name: str
    size: int
    mtime: float


@dataclass(frozen=True, slots=True)
class Listing:
    """The servable files of a workspace, sorted by name; ``truncated`` when a bound was reached.

    Iterating a listing iterates its files.
    """

    files: tuple[FileEntry, ...]
    truncated: bool = False

    def __iter__(self) -> Iterator[FileEntry]:
        return iter(self.files)

    def __len__(self) -> int:
        return len(self.files)


@dataclass(frozen=True, slots=True)
class Usage:
    """What a workspace's quota counts: regular files and the sum of their ``st_size``.

    ``complete`` is false when the walk stopped at a bound (entries, depth) or could not enter
    a directory: the numbers are then a lower bound.
    """

    bytes: int
    files: int
    complete: bool = True


@dataclass(slots=True)
class OpenFile:
    """A regular file opened for serving. The caller owns ``fd``: use it as a context manager.

    ``size`` is the size when opened; sandboxed code may still be writing, so serve ``size``
    bytes (``chunks``), not "until EOF".
    """

    fd: int
    name: str
    size: int
    mtime: float
    closed: bool = field(default=False, init=False)

    def chunks(self, chunk_size: int = 1 << 16) -> Iterator[bytes]:
        """The file's first ``size`` bytes, from the start, in chunks (fewer if it shrank)."""
        offset = 0
        while offset < self.size:
            data = os.pread(self.fd, min(chunk_size, self.size - offset), offset)
            if not data:
                return
            offset += len(data)
            yield data

    def close(self) -> None:
        """Close the fd (idempotent)."""
        if not self.closed:
            self.closed = True
            os.close(self.fd)

    def __enter__(self) -> OpenFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# What a tenant is told when the state directory's filesystem is full (or its quota reached):
# the operator's problem, said without the host's paths.
DISK_FULL = "the server's disk is full: nothing was stored; try again later, or ask the server's operator"
_FULL = frozenset({errno.ENOSPC, errno.EDQUOT})


def disk_error(exc: OSError, context: str) -> WorkspaceError:
    """The error a tenant sees for ``exc``: :class:`DiskFullError`, or ``context`` and the system's reason (no path)."""
    if exc.errno in _FULL:
        return DiskFullError(DISK_FULL)
    return WorkspaceError(f"{context}: {exc.strerror}")


def _translate(exc: OSError, name: str) -> WorkspaceError:
    if exc.errno == errno.ENOENT:
        return WorkspaceError(f"{name}: no such file in the workspace")
    if exc.errno in (errno.ELOOP, errno.ENOTDIR):
        return WorkspaceError(f"{name}: a path component is a symbolic link or not a directory")
    return disk_error(exc, name)


def open_parent(root_fd: int, name: str, *, create: bool = False, owner: tuple[int, int] | None = None) -> int:
    """Open the directory that holds ``name`` (checked), walking each component with O_NOFOLLOW.

    With ``create``, missing directories are made (0700, chowned to ``owner`` if given). The
    caller closes the returned fd.

    Raises:
        WorkspaceError: a component is missing (without ``create``), a symlink, or not a directory.
    """
    current = os.dup(root_fd)
    try:
        for part in name.split("/")[:-1]:
            made = False
            if create:
                try:
                    os.mkdir(part, 0o700, dir_fd=current)
                    made = True
                except FileExistsError:
                    pass
            child = os.open(part, DIR_FLAGS, dir_fd=current)
            os.close(current)
            current = child
            if made:
                os.fchmod(current, 0o700)  # whatever the umask
                if owner is not None:
                    os.fchown(current, *owner)
    except OSError as exc:
        os.close(current)
        raise _translate(exc, name) from exc
    return current


def open_regular(parent_fd: int, leaf: str, name: str) -> OpenFile:
    """Open the regular file ``leaf`` in ``parent_fd`` for reading, never opening anything else.

    The name is first opened with O_PATH (which opens no FIFO and no device), checked to be a
    regular file, and only then reopened for reading through its ``/proc/self/fd`` link, which
    is the same inode whatever happened to the name since.

    Raises:
        WorkspaceError: no such file, or it is a symlink, FIFO, socket, device or directory.
    """
    try:
        handle = os.open(leaf, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=parent_fd)
    except OSError as exc:
        raise _translate(exc, name) from exc
    try:
        before = os.fstat(handle)
        if not stat.S_ISREG(before.st_mode):
            raise WorkspaceError(f"{name}: not a regular file")
        try:
            fd = os.open(f"/proc/self/fd/{handle}", os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
        except OSError as exc:
            raise _translate(exc, name) from exc
    finally:
        os.close(handle)
    info = os.fstat(fd)
    if (info.st_dev, info.st_ino) != (before.st_dev, before.st_ino) or not stat.S_ISREG(info.st_mode):
        os.close(fd)  # pragma: no cover - the magic link names the inode the O_PATH fd holds
        raise WorkspaceError(f"{name}: changed while being opened")
    return OpenFile(fd=fd, name=name, size=info.st_size, mtime=info.st_mtime)


def open_file_in(root_fd: int, name: str) -> OpenFile:
    """Open the regular file ``name`` under the directory ``root_fd`` for reading; ``root_fd`` is closed.

    Raises:
        WorkspaceError: no such regular file, or a component of the way is not a real directory.
    """
    try:
        parent = open_parent(root_fd, name)
    finally:
        os.close(root_fd)
    try:
        return open_regular(parent, name.rsplit("/", 1)[-1], name)
    finally:
        os.close(parent)


def unlink_in(root_fd: int, name: str) -> None:
    """Remove the file ``name`` under the directory ``root_fd``, if it is there (no link followed on the way).

    Raises:
        WorkspaceError: it cannot be removed.
    """
    try:
        parent = open_parent(root_fd, name)
    except WorkspaceError:
        return  # its directory is gone already
    try:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(name.rsplit("/", 1)[-1], dir_fd=parent)
    except OSError as exc:
        raise disk_error(exc, f"{name}: cannot remove") from exc
    finally:
        os.close(parent)


def _servable(parts: Sequence[str]) -> bool:
    try:
        check_filename("/".join(parts))
    except ValidationError:
        return False
    return True


class Walk:
    """The regular files below a directory fd, depth first, never following a symlink.

    Iterating yields ``(path components, lstat result)``. At most ``max_entries`` directory
    entries are looked at and directories at most ``max_depth`` levels down are entered; past a
    bound the walk stops and ``complete`` becomes false, as it does when a directory cannot be
    opened. With ``servable_only``, only what :func:`open_regular` will serve under a name
    :func:`check_filename` accepts is yielded: directories whose owner closed them (no ``r-x``
    for the owner, e.g. ``chmod 000``) are skipped, not opened up, even by root.
    """

    def __init__(self, root_fd: int, *, max_depth: int, max_entries: int, servable_only: bool) -> None:
        self._root_fd = root_fd
        self._max_depth = max_depth
        self._budget = max_entries
        self._servable_only = servable_only
        self.complete = True

    def _scan(self, fd: int, prefix: tuple[str, ...]) -> tuple[list[tuple[tuple[str, ...], os.stat_result]], list[str]]:
        files: list[tuple[tuple[str, ...], os.stat_result]] = []
        directories: list[str] = []
        with os.scandir(fd) as entries:
            for entry in entries:
                if self._budget <= 0:
                    self.complete = False
                    break
                self._budget -= 1
                try:
                    info = entry.stat(follow_symlinks=False)
                except OSError:  # removed meanwhile
                    continue
                parts = (*prefix, entry.name)
                if stat.S_ISREG(info.st_mode):
                    if not self._servable_only or _servable(parts):
                        files.append((parts, info))
                elif stat.S_ISDIR(info.st_mode) and self._enters(parts, info):
                    directories.append(entry.name)
        return files, directories

    def _enters(self, parts: tuple[str, ...], info: os.stat_result) -> bool:
        if self._servable_only:
            # A file below would have too many components, or a name that cannot be served.
            if len(parts) >= MAX_COMPONENTS or not _servable(parts):
                return False
            if info.st_mode & _OWNER_RX != _OWNER_RX:
                return False
        if len(parts) > self._max_depth:
            self.complete = False
            return False
        return True

    def __iter__(self) -> Iterator[tuple[tuple[str, ...], os.stat_result]]:
        # One open fd per level: the depth bound is also the bound on open fds.
        stack: list[tuple[int, tuple[str, ...], list[str]]] = []
        fd = os.dup(self._root_fd)
        try:
            files, directories = self._scan(fd, ())
        except BaseException:
            os.close(fd)
            raise
        stack.append((fd, (), directories))
        try:
            yield from files
            while stack:
                fd, prefix, pending = stack[-1]
                if not pending:
                    os.close(fd)
                    stack.pop()
                    continue
                if self._budget <= 0:
                    self.complete = False
                    break
                name = pending.pop()
                try:
                    child = os.open(name, DIR_FLAGS, dir_fd=fd)
                except OSError as exc:
                    # Removed, or swapped for a symlink or a file meanwhile: nothing to see there.
                    if exc.errno not in (errno.ENOENT, errno.ENOTDIR, errno.ELOOP):
                        self.complete = False  # EACCES when not root
                    continue
                try:
                    files, directories = self._scan(child, (*prefix, name))
                except OSError:
                    os.close(child)
                    self.complete = False
                    continue
                stack.append((child, (*prefix, name), directories))
                yield from files
        finally:
            for fd, _, _ in stack:
                os.close(fd)
