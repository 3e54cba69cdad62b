"""The workspace side of the mirror's transfers: files placed from the store, packs written and read.

A restored file is written to a temporary file in ``uploads/`` and renamed into place through
the no-follow helpers of :mod:`mcp_sandbox.workspace.files` (a run's symlinks lead nowhere),
0600 and the workspace owner's (the tenant's host uid), as uploads are. A pack is read into an
unnamed temporary file, never memory, and each of its files copied out of it by the kernel.

One file's failure is that file's: a file that is still there but cannot be read, or that the
store refuses, is named among the job's unsaved files and the write-back goes on with the rest
(a file removed or replaced by a symlink meanwhile is no longer a workspace file: it is skipped).
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import secrets
import stat
from collections.abc import Callable
from pathlib import Path
from typing import IO

from mcp_sandbox.errors import DiskFullError, ValidationError, WorkspaceError
from mcp_sandbox.replicas.objects import ObjectStore
from mcp_sandbox.replicas.packs import INDEX, PACKS, SMALL, Index, is_pack_tag, new_pack, pack_tag
from mcp_sandbox.workspace import OpenFile, check_filename
from mcp_sandbox.workspace.files import disk_error, open_file_in, open_parent

__all__ = [
    "Entry",
    "Placer",
    "Stored",
    "key_fits",
    "read_index",
    "read_pack",
    "salvage_index",
    "stored_packs",
    "write_file",
    "write_pack",
]

Entry = tuple[int, int, str]  # a manifest entry: size, st_mtime_ns, ETag (or pack tag)
# What one upload job stored: the pack (or None) and its size, each file's manifest entry, and
# the files it could not store.
Stored = tuple[str | None, int, list[tuple[str, Entry]], list[str]]
_MAX_KEY = 1024  # S3's limit on an object's key, in UTF-8 bytes


def key_fits(objects: ObjectStore, name: str) -> bool:
    """Whether object ``name`` (relative to the store's prefix) has a key S3 takes."""
    return len((objects.prefix + name).encode()) <= _MAX_KEY


def _still_there(root: int, name: str) -> bool:
    """Whether ``name`` is still a regular file under ``root`` (reached without following a link)."""
    try:
        parent = open_parent(root, name)
    except WorkspaceError:
        return False
    try:
        return stat.S_ISREG(os.stat(name.rsplit("/", 1)[-1], dir_fd=parent, follow_symlinks=False).st_mode)
    except OSError:
        return False
    finally:
        os.close(parent)


def _open(root: int, name: str, unsaved: list[str]) -> OpenFile | None:
    """File ``name`` opened for reading; None if it is gone, or could not be read (then it is in ``unsaved``)."""
    try:
        return open_file_in(os.dup(root), name)
    except DiskFullError:
        raise
    except WorkspaceError:
        if _still_there(root, name):
            unsaved.append(name)  # e.g. a file a server not run as root may not read (chmod 000)
        return None


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
    """Store file ``item`` of the workspace open at ``root`` as an object of its own; one that
    cannot be read, or the store refuses, is named unsaved (the rest of the write-back goes on).

    Raises:
        DiskFullError: the server's disk is full.
    """
    name, info = item
    unsaved: list[str] = []
    opened = _open(root, name, unsaved)
    if opened is None:
        return None, 0, [], unsaved
    with opened, os.fdopen(os.dup(opened.fd), "rb") as body:
        try:
            etag = objects.put(under + name, body)
        except WorkspaceError:
            return None, 0, [], [name]  # the store refused this one (logged): the rest go on
    return None, 0, [(name, (info.st_size, info.st_mtime_ns, etag))], []


def read_index(objects: ObjectStore, under: str) -> Index:
    """The index of packed files under ``under`` (empty if there is none), with the ETag it was read at.

    Raises:
        WorkspaceError: the store refused, or the index is unreadable.
    """
    found = _index_object(objects, under)
    return Index() if found is None else Index.decode(*found)


def _index_object(objects: ObjectStore, under: str) -> tuple[bytes, str] | None:
    """The bytes of the index object under ``under`` and its ETag; None where there is none.

    Raises:
        WorkspaceError: the store refused.
    """
    into = io.BytesIO()
    try:
        etag = objects.get(under + INDEX, into)
    except FileNotFoundError:
        return None
    return into.getvalue(), etag


def stored_packs(objects: ObjectStore, under: str) -> dict[str, int]:
    """The packs the store lists under ``under`` (name relative to ``under`` -> size), the index aside.

    Raises:
        WorkspaceError: the store refused.
    """
    return {PACKS + item.name: item.size for item in objects.list(under + PACKS) if PACKS + item.name != INDEX}


def salvage_index(objects: ObjectStore, under: str, stored: dict[str, int]) -> tuple[Index, list[str]] | None:
    """The index under ``under`` as far as it can be restored from the packs ``stored``, with the
    ETag it was read at, and the files it names that cannot be (see :meth:`Index.salvage`); None
    for an index that cannot be read at all.

    Raises:
        WorkspaceError: the store refused.
    """
    found = _index_object(objects, under)
    if found is None:
        return Index(), []
    data, etag = found
    salvaged = Index.salvage(data, stored)
    if salvaged is not None:
        salvaged[0].etag = etag
    return salvaged


def index_in_place(objects: ObjectStore, under: str) -> Index:
    """An empty index standing where the (damaged) one under ``under`` is: its ETag, and its epoch
    where that can still be read, so that the index rebuilt in its place replaces it conditionally.

    Raises:
        WorkspaceError: the store refused.
    """
    found = _index_object(objects, under)
    if found is None:
        return Index()
    data, etag = found
    try:
        epoch = int(json.loads(data).get("epoch", 0))
    except (ValueError, TypeError, AttributeError):
        epoch = 0
    return Index(epoch=epoch, etag=etag)


def write_pack(
    objects: ObjectStore, root: int, under: str, spool: Path, batch: list[tuple[str, os.stat_result]]
) -> Stored:
    """Store the files ``batch`` of the workspace open at ``root`` as one new pack (made in an
    unnamed temporary file in the directory ``spool``, not in memory).

    A file that grew past :data:`SMALL` meanwhile is stored on its own instead (where its key
    fits); one removed or replaced by a symlink is left out (the next write-back sees it); one
    that cannot be read, or the store refuses, is named unsaved, as is every file of a pack the
    store refuses.

    Raises:
        WorkspaceError: the disk refused.
    """
    pack = new_pack()
    entries: list[tuple[str, Entry]] = []
    unsaved: list[str] = []
    try:
        with os.fdopen(os.open(spool, os.O_RDWR | os.O_TMPFILE | os.O_CLOEXEC, 0o600), "w+b") as body:
            for name, _ in batch:
                opened = _open(root, name, unsaved)
                if opened is None:
                    continue
                with opened:
                    mtime = os.fstat(opened.fd).st_mtime_ns
                    if opened.size >= SMALL and key_fits(objects, under + name):
                        with os.fdopen(os.dup(opened.fd), "rb") as alone:
                            try:
                                entries.append((name, (opened.size, mtime, objects.put(under + name, alone))))
                            except WorkspaceError:
                                unsaved.append(name)
                        continue
                    offset = body.tell()
                    for chunk in opened.chunks(SMALL):
                        body.write(chunk)
                    # The bytes read: a file that shrank meanwhile differs from its entry and is sent again.
                    entries.append((name, (body.tell() - offset, mtime, pack_tag(pack, offset))))
            size = body.tell()
            packed = [name for name, entry in entries if is_pack_tag(entry[2])]
            if not packed:
                return None, 0, entries, unsaved
            body.flush()
            body.seek(0)
            try:
                objects.put(under + pack, body)
            except WorkspaceError:  # the store refused the pack: its files are unsaved, the others stored
                own = [(name, entry) for name, entry in entries if not is_pack_tag(entry[2])]
                return None, 0, own, [*unsaved, *packed]
    except OSError as exc:
        raise disk_error(exc, "cannot store the workspace's files") from exc
    return pack, size, entries, unsaved


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
            if index.packs[pack]:  # a pack of empty files has no bytes to fetch
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
