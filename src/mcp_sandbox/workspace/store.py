"""Conversation workspaces on disk: ``state_dir/workspaces/<key>``, seen by the sandbox as ``/workspace``.

A conversation's directory is named by a keyed hash of its tenant and id, so ids never become
paths and tenants never share a directory. ``workspaces/`` is the server's, traversable (never
listable) by the sandbox uid: 0710 with the sandbox gid as group when the server is root, so no
other host user reaches a workspace even if a run opened its mode (see :mod:`mcp_sandbox.state`).
Each conversation's directory is 0700 and its tenant's host uid's (``mcp_sandbox.tenant_uids``),
which also owns every file the host writes there; one made as another uid's is handed over
(:mod:`.owner`) on its first use.

Sandboxed code may be running in a directory while the host lists, serves or writes it: every
operation goes through :mod:`mcp_sandbox.workspace.files`, which never follows a link.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import logging
import os
import re
import stat
from collections.abc import Iterable
from pathlib import Path

from mcp_sandbox.config import DEFAULT_TENANT, WorkspaceSettings
from mcp_sandbox.errors import QuotaExceededError, WorkspaceError
from mcp_sandbox.tenant_uids import TenantUids
from mcp_sandbox.workspace.changes import ChangeGate
from mcp_sandbox.workspace.checkpoints import delete_checkpoints
from mcp_sandbox.workspace.cloning import CloneCounts, fork_directory
from mcp_sandbox.workspace.files import (
    DIR_FLAGS,
    FileEntry,
    Listing,
    OpenFile,
    Usage,
    Walk,
    disk_error,
    open_file_in,
    open_parent,
)
from mcp_sandbox.workspace.names import check_filename
from mcp_sandbox.workspace.owner import hand_over
from mcp_sandbox.workspace.partials import MAX_DEPTH, MAX_LIST_ENTRIES, sweep_partials
from mcp_sandbox.workspace.removal import remove_tree
from mcp_sandbox.workspace.reservations import QuotaBook
from mcp_sandbox.workspace.secret import derive_key
from mcp_sandbox.workspace.usage import measure_usage
from mcp_sandbox.workspace.writing import Admit, PendingWrite

__all__ = ["MAX_DEPTH", "MAX_LIST_ENTRIES", "WorkspaceStore"]

logger = logging.getLogger(__name__)

_KEY_RE = re.compile(r"^[0-9a-f]{64}$")


def _framed(value: str) -> bytes:
    # Length-prefixed, so no tenant name can contain a separator that shifts the boundary.
    # surrogatepass: a JSON string may hold a lone surrogate; the encoding stays injective.
    data = value.encode("utf-8", "surrogatepass")
    return len(data).to_bytes(8, "big") + data


class WorkspaceStore:
    """The workspaces of all conversations under the state directory of ``uids``' layout (the engine's).

    Methods are synchronous and may block on the disk: call them from a worker thread
    (``anyio.to_thread.run_sync``). They are safe to call concurrently.
    """

    def __init__(
        self, workspaces: WorkspaceSettings, secret: bytes, uids: TenantUids, gate: ChangeGate | None = None
    ) -> None:
        """``workspaces``: the quotas; ``uids``: the tenants' host uids and the layout they are kept in."""
        self.workspace_settings = workspaces
        self.gate = ChangeGate() if gate is None else gate  # the change locks, shared with the engine
        self.layout = uids.layout
        self.root = self.layout.workspaces
        self._key = derive_key(secret, "workspace")
        # Root writes as the tenant's host uid's files, so that sandboxed code can change them.
        self._uids = uids
        # Writes in progress hold reservations: concurrent uploads cannot pass the quota together.
        self._quota = QuotaBook(workspaces.quota_bytes, workspaces.quota_files, self.usage, self.gate)

    def key(self, tenant: str, conversation_id: str) -> str:
        """The directory name of ``tenant``'s conversation ``conversation_id`` (64 hex digits)."""
        return hmac.new(self._key, _framed(tenant) + _framed(conversation_id), hashlib.sha256).hexdigest()

    def directory(self, key: str) -> Path:
        """Where conversation ``key`` lives (whether or not it exists yet).

        Raises:
            WorkspaceError: ``key`` is not of the form this store makes (64 hex digits).
        """
        if not _KEY_RE.match(key):
            raise WorkspaceError("not a conversation key")
        return self.root / key

    def prepare(self) -> None:
        """Create ``state_dir`` and ``workspaces/`` (traversable by the sandbox uid, not listable). Idempotent.

        Raises:
            WorkspaceError: they cannot be created.
        """
        try:
            self.layout.prepare_workspaces()
            self.layout.prepare_uploads()
        except OSError as exc:
            raise disk_error(exc, "cannot create the workspaces directory") from exc

    def sweep_partials(self) -> int:
        """Delete what uploads and forks cut by a crash left (see :mod:`.partials`); how many were deleted."""
        return sweep_partials(self.layout, self.root, self.keys(), self._open_root)

    def ensure(self, key: str, tenant: str | None = None) -> Path:
        """Create conversation ``key``'s directory if needed (0700, ``tenant``'s host uid's); return it.

        ``tenant`` None: a directory already there keeps its owner (a new one is the default
        tenant's). An existing one of another uid is handed over with what it holds.

        Raises:
            WorkspaceError: it cannot be created or handed over, or something that is not a
                directory is there.
        """
        path = self.directory(key)
        if not self.root.is_dir() or not self.layout.uploads.is_dir():
            self.prepare()
        try:
            with contextlib.suppress(FileExistsError):
                os.mkdir(path, 0o700)
            fd = os.open(path, DIR_FLAGS)
        except OSError as exc:
            raise disk_error(exc, "cannot create the conversation's workspace") from exc
        try:
            # Also repairs a directory left root's by a crash, or opened up by the code inside.
            os.fchmod(fd, 0o700)
            self._own(fd, tenant)
        except OSError as exc:
            raise disk_error(exc, "cannot give the conversation's workspace its owner") from exc
        finally:
            os.close(fd)
        return path

    def _own(self, fd: int, tenant: str | None) -> None:
        """Give workspace directory ``fd`` (and, when it changes hands, what it holds) its tenant's uid."""
        info = os.fstat(fd)
        if tenant is None and info.st_uid != 0:
            return  # keeps its tenant's owner
        ids = self._uids.ids(DEFAULT_TENANT if tenant is None else tenant)
        if ids is None or (info.st_uid, info.st_gid) == ids:
            return
        if info.st_uid == 0:  # just made, or left root's by a crash: nothing below is another tenant's
            os.fchown(fd, *ids)
        elif not hand_over(fd, *ids):
            logger.warning("a workspace handed to its tenant's uid kept the owner of what lies deeper than it reached")

    def _owner(self, root: int) -> tuple[int, int] | None:
        """Who owns what the host writes in workspace directory ``root`` (None: the server, not root)."""
        if os.geteuid() != 0:
            return None
        info = os.fstat(root)
        return info.st_uid, info.st_gid

    def keys(self) -> list[str]:
        """The keys of every conversation directory on disk."""
        try:
            with os.scandir(self.root) as entries:
                return sorted(entry.name for entry in entries if _KEY_RE.match(entry.name))
        except FileNotFoundError:
            return []

    def _open_root(self, key: str) -> int | None:
        """The workspace's directory fd, or None when it does not exist."""
        try:
            return os.open(self.directory(key), DIR_FLAGS)
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise WorkspaceError(f"the conversation's workspace cannot be opened: {exc.strerror}") from exc

    def _require_root(self, key: str, name: str) -> int:
        if (root := self._open_root(key)) is None:
            raise WorkspaceError(f"{name}: no such file in the workspace")
        return root

    def list_files(self, key: str, *, max_entries: int = MAX_LIST_ENTRIES) -> Listing:
        """The regular files that :meth:`open_file` serves, sorted by name.

        Symlinks, FIFOs, sockets and devices are skipped, and so are names that are not UTF-8
        or that :func:`check_filename` refuses, directories closed by their owner (``chmod
        000``), and anything in the reserved namespace. A missing workspace lists nothing.

        Raises:
            WorkspaceError: the workspace directory cannot be read (or ``key`` is malformed).
        """
        root = self._open_root(key)
        if root is None:
            return Listing(files=())
        try:
            walk = Walk(root, max_depth=MAX_DEPTH, max_entries=max_entries, servable_only=True)
            found = [FileEntry("/".join(parts), info.st_size, info.st_mtime) for parts, info in walk]
        except OSError as exc:  # the top directory itself (the code may chmod /workspace)
            raise WorkspaceError(f"the conversation's workspace cannot be read: {exc.strerror}") from exc
        finally:
            os.close(root)
        found.sort(key=lambda entry: entry.name)
        return Listing(files=tuple(found), truncated=not walk.complete)

    def usage(self, key: str) -> Usage:
        """What conversation ``key``'s quota counts (:func:`.usage.measure_usage`).

        Raises:
            WorkspaceError: the workspace directory cannot be read (or ``key`` is malformed).
        """
        self.directory(key)  # the key checked before it names a path
        root = self._open_root(key)
        try:
            return measure_usage(self.layout, key, root, self.workspace_settings.quota_files)
        finally:
            if root is not None:
                os.close(root)

    def begin_write(self, key: str, name: str, tenant: str | None = None) -> PendingWrite:
        """Start writing ``name`` (creating the workspace, ``tenant``'s, and parent directories as needed).

        Write chunks with ``PendingWrite.write``, then ``commit``; use it as a context manager
        so that an abandoned write leaves nothing behind.

        Raises:
            ValidationError: ``name`` is not an acceptable file name.
            QuotaExceededError: a new file would exceed the conversation's file quota.
            WorkspaceError: a parent component is a symlink or not a directory, ``name`` is a
                directory, or the disk refused.
        """
        check_filename(name)
        self.ensure(key, tenant)
        usage = self.usage(key)
        # At the file quota only a replacement can succeed: then make no directories for it.
        full = usage.files >= self.workspace_settings.quota_files
        with self.gate.changing(key):  # no folder made inside an adoption or a fork's copy
            root = self._require_root(key, name)
            try:
                owner = self._owner(root)
                parent = open_parent(root, name, create=not full, owner=owner)
            except WorkspaceError:
                if full:
                    raise self._files_exceeded(name, usage) from None
                raise
            finally:
                os.close(root)
        leaf = name.rsplit("/", 1)[-1]
        try:
            try:
                old = os.stat(leaf, dir_fd=parent, follow_symlinks=False)
            except FileNotFoundError:
                old = None
            if old is not None and stat.S_ISDIR(old.st_mode):
                raise WorkspaceError(f"{name}: is a directory")
            replaced = old.st_size if old is not None and stat.S_ISREG(old.st_mode) else None
            if full and replaced is None:
                raise self._files_exceeded(name, usage)
        except BaseException:
            os.close(parent)
            raise
        try:
            staging = os.open(self.layout.uploads, DIR_FLAGS)
        except OSError as exc:
            os.close(parent)
            raise disk_error(exc, f"{name}: cannot write in the workspace") from exc
        reservation = self._quota.open(key, name, usage, replaced)

        def reopen() -> int:  # at commit: the parent where the conversation's directory is then
            root = self._require_root(key, name)
            try:
                return open_parent(root, name, create=True, owner=owner)
            finally:
                os.close(root)

        try:
            return PendingWrite(
                parent, leaf, name, staging_fd=staging, reservation=reservation, owner=owner, reopen=reopen
            )
        except BaseException:
            reservation.release()
            raise

    def _files_exceeded(self, name: str, usage: Usage) -> QuotaExceededError:
        quota = self.workspace_settings.quota_files
        return QuotaExceededError(
            "files", usage.files, quota, f"{name}: the conversation has {usage.files} files, its quota is {quota}"
        )

    def write_file(
        self, key: str, name: str, data: bytes | Iterable[bytes], tenant: str | None = None, admit: Admit | None = None
    ) -> FileEntry:
        """Store ``data`` (bytes, or chunks of unknown total) as ``name``, atomically (``admit``: see ``commit``).

        Raises:
            ValidationError: ``name`` is not an acceptable file name.
            QuotaExceededError: the write would exceed the byte or file quota; nothing changed.
            WorkspaceError: see :meth:`begin_write` and :meth:`PendingWrite.commit`; nothing changed.
        """
        chunks = [data] if isinstance(data, bytes | bytearray | memoryview) else data
        with self.begin_write(key, name, tenant) as pending:
            for chunk in chunks:
                pending.write(chunk)
            return pending.commit(admit)

    def open_file(self, key: str, name: str) -> OpenFile:
        """Open regular file ``name`` of conversation ``key`` for serving; the caller closes it.

        Raises:
            ValidationError: ``name`` is not an acceptable file name.
            WorkspaceError: no such regular file (missing, a symlink, FIFO, socket, device or
                directory, or a path component that is not a real directory).
        """
        check_filename(name)
        root = self._require_root(key, name)
        return open_file_in(root, name)

    def delete_file(self, key: str, name: str) -> None:
        """Delete ``name``; a symlink is removed itself, never its target.

        Raises:
            ValidationError: ``name`` is not an acceptable file name.
            WorkspaceError: no such file, or it is a directory.
        """
        check_filename(name)
        root = self._require_root(key, name)
        try:
            parent = open_parent(root, name)
        finally:
            os.close(root)
        try:
            os.unlink(name.rsplit("/", 1)[-1], dir_fd=parent)
        except FileNotFoundError as exc:
            raise WorkspaceError(f"{name}: no such file in the workspace") from exc
        except OSError as exc:
            raise disk_error(exc, f"{name}: cannot delete") from exc
        finally:
            os.close(parent)

    def fork(self, source: str, target: str, tenant: str) -> CloneCounts:
        """Copy conversation ``source``'s files into the new ``target`` (:mod:`.cloning`); no upload lands meanwhile.

        Raises:
            QuotaExceededError: the source's files are over a conversation's quota; nothing copied.
            WorkspaceError: ``target`` exists, or the copy failed; nothing is left of it.
        """
        quota = Usage(bytes=self.workspace_settings.quota_bytes, files=self.workspace_settings.quota_files)
        owner, paths = self._uids.ids(tenant), (self.directory(source), self.directory(target))
        with self.gate.changing(source, target):
            return fork_directory(*paths, owner, self.usage(source), quota, max_depth=MAX_DEPTH)

    def delete(self, key: str) -> None:
        """Delete conversation ``key``'s whole workspace. Only when no sandbox runs in it.

        Raises:
            WorkspaceError: it could not be removed completely.
        """
        directory = self.directory(key)
        try:
            for state in (self.layout.parked_state(key), self.layout.held_state(key)):
                with contextlib.suppress(FileNotFoundError):  # its parked interpreter state goes with it
                    os.unlink(state)
            delete_checkpoints(self.layout, key)  # and its checkpoints
            remove_tree(directory)
        except OSError as exc:
            raise WorkspaceError(f"cannot delete the conversation's workspace: {exc.strerror}") from exc
