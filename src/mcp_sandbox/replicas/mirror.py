"""Conversations' workspaces and tenants' libraries mirrored to the object store, each under its prefix.

A workspace is at ``workspaces/<key>/``, its manifest at ``state_dir/mirror/<key>.json``; a
library at ``library/<name>/``. :meth:`Mirror.write_back` and :meth:`Mirror.restore` hold the
conversation's lock and hand its directory to :mod:`.directory_sync`, which moves what changed
(small files in packs for a workspace, the index written only by the conversation's lease
holder: :mod:`.indexing`), as files owned by the tenant's host uid. Besides: a file read from the
store for a replica that has not got it (:meth:`Mirror.open_remote`), the earlier runner's links
(:mod:`.runner_records`), and a conversation's objects deleted. Transfers run on the store's threads; the
methods block.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from pathlib import Path

from mcp_sandbox.errors import WorkspaceError
from mcp_sandbox.replicas import indexing
from mcp_sandbox.replicas.checkpoints import forget_checkpoints
from mcp_sandbox.replicas.directory_sync import Changes, restore_directory, write_back_directory
from mcp_sandbox.replicas.objects import ObjectStore
from mcp_sandbox.replicas.parked import StoredParked
from mcp_sandbox.replicas.runner_records import link_name
from mcp_sandbox.replicas.transfers import read_index
from mcp_sandbox.workspace import OpenFile, WorkspaceStore, check_filename
from mcp_sandbox.workspace.checkpoints import checkpoint_names
from mcp_sandbox.workspace.fencing import Check, unfenced
from mcp_sandbox.workspace.files import DIR_FLAGS, disk_error

__all__ = ["Changes", "Mirror"]

_RESTORE_ATTEMPTS = 3  # an earlier owner's index landing during a restore: read again


class Mirror:
    """The workspaces of ``workspaces`` mirrored into ``objects``."""

    def __init__(self, objects: ObjectStore, workspaces: WorkspaceStore, grace: float = 0.0) -> None:
        self.objects = objects
        self._grace = grace  # packs no index names are swept once this old (see .indexing)
        self._workspaces = workspaces
        layout = workspaces.layout
        self._manifests = layout.mirror
        self._staging = layout.uploads
        # One write-back or restore of a conversation at a time: each reads and replaces its manifest.
        self._locks: dict[str, threading.Lock] = {}

    def _lock(self, name: str) -> threading.Lock:
        # setdefault is one step under the GIL: two threads never get two locks of one name.
        return self._locks.setdefault(name, threading.Lock())

    @staticmethod
    def _under(key: str) -> str:
        return f"workspaces/{key}/"

    def _manifest_path(self, key: str) -> Path:
        self._workspaces.directory(key)  # checks the key's form
        return self._manifests / f"{key}.json"

    def _open_root(self, key: str) -> int | None:
        try:
            return os.open(self._workspaces.directory(key), DIR_FLAGS)
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise WorkspaceError(f"the conversation's workspace cannot be opened: {exc.strerror}") from exc

    # --- write-back ---

    def write_back(self, key: str, fence: Check = unfenced, epoch: int = 0) -> Changes:
        """Upload conversation ``key``'s changed files, delete the objects of removed ones; ``fence()``
        checks that this replica still holds the lease (of ``epoch``; 0: one server), before anything
        is put, and before and after the index (:mod:`.indexing`).

        Raises:
            LeaseLostError: ``fence`` found the lease lost. WorkspaceError: the workspace cannot be read, or
                the store refused (the manifest keeps what reached the store: the next write-back does the rest).
        """
        with self._lock(key):
            root = self._open_root(key)
            if root is None:
                return Changes()
            try:
                under, manifest = self._under(key), self._manifest_path(key)
                return write_back_directory(
                    self.objects, self._staging, root, under, manifest, packed=True, fence=fence, epoch=epoch
                )
            finally:
                os.close(root)

    # --- restore ---

    def restore(self, key: str, tenant: str | None, epoch: int = 0) -> Changes:
        """Make conversation ``key``'s directory (``tenant``'s) equal to the store's copy, and mark
        its index with lease ``epoch`` (the one just taken here; 0: one server) before sweeping.

        Raises:
            WorkspaceError: the directory cannot be made or written, or the store refused.
            LeaseLostError: a later epoch wrote the index.
        """
        with self._lock(key):
            for _ in range(_RESTORE_ATTEMPTS):
                with contextlib.suppress(indexing.IndexMoved):  # an earlier owner's write landed first
                    return self._restore_key(key, tenant, epoch)
            raise WorkspaceError("the workspace kept changing in the object store while it was restored: retry")

    def restore_new(self, key: str, tenant: str | None) -> Changes:
        """:meth:`restore` conversation ``key`` unless this server has its directory already, then
        make the directory; one caller at a time per conversation.

        Once: a second restore would remove, as extras the store lacks, files the first
        requests stored meanwhile and did not yet write back.

        Raises:
            WorkspaceError: see :meth:`restore`.
        """
        with self._lock(key):
            if self._workspaces.directory(key).is_dir():
                return Changes()
            changes = self._restore_key(key, tenant)
            self._workspaces.ensure(key, tenant)
            return changes

    def _restore_key(self, key: str, tenant: str | None, epoch: int = 0) -> Changes:
        listed = self.objects.list(self._under(key))
        if not listed and not self._workspaces.directory(key).is_dir():
            return Changes()  # a new conversation: no directory made for nothing
        self._workspaces.ensure(key, tenant)
        root = self._open_root(key)
        if root is None:
            raise WorkspaceError("the conversation's workspace vanished while it was restored")
        try:
            under, manifest = self._under(key), self._manifest_path(key)
            return restore_directory(
                self.objects, self._staging, self._grace, root, under, manifest, listed, packed=True, epoch=epoch
            )
        finally:
            os.close(root)

    # --- a tenant's library (saved tools and memories) ---

    def _library(self, directory: Path) -> tuple[str, Path]:
        return f"library/{directory.name}/", self._manifests / f"library-{directory.name}.json"

    def push(self, directory: Path) -> Changes:
        """Write back a tenant's library directory (``state_dir/library/<HMAC>``) after a change.

        Raises:
            WorkspaceError: the store refused.
        """
        under, manifest = self._library(directory)
        with self._lock(under):
            try:
                root = os.open(directory, DIR_FLAGS)
            except FileNotFoundError:
                root = None
            except OSError as exc:
                raise disk_error(exc, "the library cannot be read") from exc
            if root is None:
                return Changes()
            try:
                return write_back_directory(self.objects, self._staging, root, under, manifest, packed=False)
            finally:
                os.close(root)

    def pull(self, directory: Path) -> Changes:
        """Make a tenant's library directory equal to the store's copy (before a run reads it).

        Raises:
            WorkspaceError: the store or the disk refused.
        """
        under, manifest = self._library(directory)
        with self._lock(under):
            listed = self.objects.list(under)
            if not listed and not directory.is_dir():
                return Changes()
            try:
                directory.mkdir(mode=0o700, parents=True, exist_ok=True)
                root = os.open(directory, DIR_FLAGS)
            except OSError as exc:
                raise disk_error(exc, "the library cannot be written") from exc
            try:
                return restore_directory(
                    self.objects, self._staging, self._grace, root, under, manifest, listed, packed=False
                )
            finally:
                os.close(root)

    # --- downloads and deletion ---

    def open_remote(self, key: str, name: str) -> OpenFile:
        """File ``name`` of conversation ``key`` read from the store into an unnamed temporary file.

        Raises:
            WorkspaceError: there is no such object, or the store refused.
        """
        check_filename(name)
        if not self._staging.is_dir():
            self._workspaces.prepare()
        try:
            fd = os.open(self._staging, os.O_RDWR | os.O_TMPFILE | os.O_CLOEXEC, 0o600)
        except OSError as exc:
            raise disk_error(exc, f"{name}: cannot read the file") from exc
        under = self._under(key)
        try:
            index = read_index(self.objects, under)
            with os.fdopen(os.dup(fd), "wb") as into:
                if name in index.files:
                    pack, offset, length = index.files[name]
                    self.objects.get_range(under + pack, offset, length, into)
                else:
                    self.objects.get(under + name, into)
        except FileNotFoundError:
            os.close(fd)
            raise WorkspaceError(f"{name}: no such file in the workspace") from None
        except BaseException:
            os.close(fd)
            raise
        return OpenFile(fd=fd, name=name, size=os.fstat(fd).st_size, mtime=time.time())

    def record_link(self, digest: str, key: str) -> None:
        """Write back conversation ``key`` (the earlier runner's data just adopted into it) and record
        that the runner's links ``/files/{digest}/…`` are its files, so every replica serves them.

        Raises:
            WorkspaceError: ``digest`` or ``key`` is not of its form, or the store refused.
        """
        self.write_back(key)
        self.objects.put(link_name(digest), key.encode("ascii"))

    def forget(self, key: str) -> None:
        """Delete conversation ``key``'s objects and manifest (retention, a deleted conversation).

        Raises:
            WorkspaceError: the store refused.
        """
        with self._lock(key):
            names = [item.name for item in self.objects.list(self._under(key))]
            if names:
                self.objects.delete(self._under(key) + name for name in names)
            StoredParked(self.objects).delete(key)  # its parked interpreter state, if any
            forget_checkpoints(self.objects, key, checkpoint_names(self._workspaces.layout, key))
            with contextlib.suppress(FileNotFoundError):
                self._manifest_path(key).unlink()
        self._locks.pop(key, None)  # a conversation deleted: its lock goes too
