"""The workspace side of the mirror's transfers: files placed from the store, packs written and read.

A restored file is written to a temporary file in ``uploads/`` and renamed into place through
the no-follow helpers of :mod:`mcp_sandbox.workspace.files` (a run's symlinks lead nowhere),
0600 and the workspace owner's (the tenant's host uid), as uploads are. A pack is read into an
unnamed temporary file, never memory, and each of its files copied out of it by the kernel.
"""

from __future__ import annotations

import contextlib
import io
import os
import secrets
from collections.abc import Callable
from pathlib import Path
from typing import IO

from mcp_sandbox.errors import ValidationError, WorkspaceError
from mcp_sandbox.replicas.objects import ObjectStore
from mcp_sandbox.replicas.packs import INDEX, SMALL, Index, is_pack_tag, new_pack, pack_tag
from mcp_sandbox.workspace import check_filename
from mcp_sandbox.workspace.files import disk_error, open_file_in, open_parent

__all__ = ["Entry", "Placer", "Stored", "read_index", "read_pack", "write_file", "write_pack"]

Entry = tuple[int, int, str]  # a manifest entry: size, st_mtime_ns, ETag (or pack tag)
# What one upload job stored: the pack (or None) and its size, and each file's manifest entry.
Stored = tuple[str | None, int, list[tuple[str, Entry]]]


class Placer:
    """Writes one file ``name`` of the workspace open at ``root`` (through ``staging``)."""

    def __init__(self, root: int, staging: int, owner: tuple[int, int] | None, name: str) -> None:
        try:
            check_filename(name)
        except ValidationError as exc:
            raise WorkspaceError(f"the object store holds a file under an unacceptable name: {exc}") from None
        self.root, self.staging, self.owner, self.name = root, staging, owner, name

    def fill(self, write: Callable[[IO[bytes]], str]) -> Entry:
        """Put what ``write`` writes (it returns the ETag) in place of the file; its manifest entry.

        Raises:
            WorkspaceError: the object is gone from the store, or the disk or a path refused.
        """
        name, staging = self.name, self.staging
        temporary = f"{os.getpid()}-{secrets.token_hex(12)}"
        try:
            flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
            with os.fdopen(os.open(temporary, flags, 0o600, dir_fd=staging), "wb") as into:
                renamed = False
                try:
                    etag = write(into)
                    into.flush()
                    os.fchmod(into.fileno(), 0o600)
                    if self.owner is not None:
                        os.fchown(into.fileno(), *self.owner)
                    parent = open_parent(self.root, name, create=True, owner=self.owner)
                    try:
                        os.rename(temporary, name.rsplit("/", 1)[-1], src_dir_fd=staging, dst_dir_fd=parent)
                        renamed = True
                    finally:
                        os.close(parent)
                    info = os.fstat(into.fileno())
                finally:
                    if not renamed:
                        with contextlib.suppress(FileNotFoundError):
                            os.unlink(temporary, dir_fd=staging)
        except FileNotFoundError:
            raise WorkspaceError(f"{name}: removed from the object store while it was restored") from None
        except OSError as exc:
            raise disk_error(exc, f"{name}: cannot restore the file") from exc
        return info.st_size, info.st_mtime_ns, etag


def write_file(objects: ObjectStore, root: int, under: str, item: tuple[str, os.stat_result]) -> Stored:
    """Store file ``item`` of the workspace open at ``root`` as an object of its own.

    Raises:
        WorkspaceError: the store refused.
    """
    name, info = item
    try:
        opened = open_file_in(os.dup(root), name)
    except WorkspaceError:
        return None, 0, []  # removed or replaced by a symlink meanwhile: the next write-back sees it
    with opened, os.fdopen(os.dup(opened.fd), "rb") as body:
        etag = objects.put(under + name, body)
    return None, 0, [(name, (info.st_size, info.st_mtime_ns, etag))]


def read_index(objects: ObjectStore, under: str) -> Index:
    """The index of packed files under ``under`` (empty if there is none), with the ETag it was read at.

    Raises:
        WorkspaceError: the store refused, or the index is unreadable.
    """
    into = io.BytesIO()
    try:
        etag = objects.get(under + INDEX, into)
    except FileNotFoundError:
        return Index()
    return Index.decode(into.getvalue(), etag)


def write_pack(
    objects: ObjectStore, root: int, under: str, spool: Path, batch: list[tuple[str, os.stat_result]]
) -> Stored:
    """Store the files ``batch`` of the workspace open at ``root`` as one new pack (made in an
    unnamed temporary file in the directory ``spool``, not in memory).

    A file that grew past :data:`SMALL` meanwhile is stored on its own instead; one removed or
    replaced by a symlink is left out (the next write-back sees it).

    Raises:
        WorkspaceError: the store or the disk refused.
    """
    pack = new_pack()
    entries: list[tuple[str, Entry]] = []
    try:
        with os.fdopen(os.open(spool, os.O_RDWR | os.O_TMPFILE | os.O_CLOEXEC, 0o600), "w+b") as body:
            for name, _ in batch:
                try:
                    opened = open_file_in(os.dup(root), name)
                except WorkspaceError:
                    continue
                with opened:
                    mtime = os.fstat(opened.fd).st_mtime_ns
                    if opened.size >= SMALL:
                        with os.fdopen(os.dup(opened.fd), "rb") as alone:
                            entries.append((name, (opened.size, mtime, objects.put(under + name, alone))))
                        continue
                    offset = body.tell()
                    for chunk in opened.chunks(SMALL):
                        body.write(chunk)
                    # The bytes read: a file that shrank meanwhile differs from its entry and is sent again.
                    entries.append((name, (body.tell() - offset, mtime, pack_tag(pack, offset))))
            size = body.tell()
            if not any(is_pack_tag(entry[2]) for _, entry in entries):
                return None, 0, entries
            body.flush()
            body.seek(0)
            objects.put(under + pack, body)
    except OSError as exc:
        raise disk_error(exc, "cannot store the workspace's files") from exc
    return pack, size, entries


def read_pack(
    objects: ObjectStore, under: str, pack: str, index: Index, names: list[str], place: Callable[[str], Placer]
) -> list[tuple[str, Entry]]:
    """Fetch ``pack`` once and place its files ``names`` (each as ``index`` says).

    Raises:
        WorkspaceError: the pack is gone or not the size the index says, or the disk refused.
    """
    placers = [place(name) for name in names]  # every name checked before anything is fetched
    try:
        fd = os.open(".", os.O_RDWR | os.O_TMPFILE | os.O_CLOEXEC, 0o600, dir_fd=placers[0].staging)
    except OSError as exc:
        raise disk_error(exc, "cannot restore the workspace") from exc
    with os.fdopen(fd, "w+b") as spool:
        try:
            objects.get(under + pack, spool)
            spool.flush()
        except FileNotFoundError:
            raise WorkspaceError("a pack of the workspace was removed from the object store") from None
        except OSError as exc:
            raise disk_error(exc, "cannot restore the workspace") from exc
        if os.fstat(fd).st_size != index.packs[pack]:
            raise WorkspaceError("a pack of the workspace is not the size its index says")

        def copier(offset: int, length: int) -> Callable[[IO[bytes]], str]:
            def copy(into: IO[bytes]) -> str:
                position, left = offset, length
                while left:
                    done = os.copy_file_range(fd, into.fileno(), left, position)
                    if done == 0:
                        raise WorkspaceError("a pack of the workspace ends early")
                    position, left = position + done, left - done
                return pack_tag(pack, offset)

            return copy

        found: list[tuple[str, Entry]] = []
        for placer in placers:
            _, offset, length = index.files[placer.name]
            found.append((placer.name, placer.fill(copier(offset, length))))
        return found
