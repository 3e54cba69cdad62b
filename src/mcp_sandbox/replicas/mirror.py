"""A conversation's workspace mirrored to the object store, at ``prefix/workspaces/<key>/<name>``.

:meth:`Mirror.write_back` uploads the files that changed since the last write-back or restore
and deletes the objects of files that are gone: a manifest per workspace (``state_dir/mirror/
<key>.json``: size, ``st_mtime_ns`` and the object's ETag of each file) tells what changed
without reading any file. :meth:`Mirror.restore` makes the local directory equal to the store's
copy: it downloads what is missing or differs and removes local extras. What is mirrored is what
the listing serves (and the metadata index counts): regular files under acceptable names, read
and written through the no-follow helpers of :mod:`mcp_sandbox.workspace.files`, so a run's
symlinks lead nowhere; restored files are the tenant's host uid's, as uploads are. The earlier
runner's links name their conversation at ``prefix/runner-links/<digest>``. Transfers run in
parallel on the store's threads; the methods block (call them from a worker thread).
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import secrets
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from mcp_sandbox.errors import ValidationError, WorkspaceError
from mcp_sandbox.replicas.objects import ObjectStore, StoredObject
from mcp_sandbox.state import StateLayout
from mcp_sandbox.workspace import OpenFile, WorkspaceStore, check_filename
from mcp_sandbox.workspace.fencing import Check, unfenced
from mcp_sandbox.workspace.files import DIR_FLAGS, Walk, disk_error, open_file_in, open_parent, unlink_in
from mcp_sandbox.workspace.store import MAX_DEPTH, MAX_LIST_ENTRIES

__all__ = ["Changes", "Mirror"]

_DIGEST_RE = re.compile(r"^[0-9a-f]{64}$")  # the earlier runner's name of a conversation's directory

# name -> (size, st_mtime_ns, ETag): what the store holds for the local file of that size and mtime.
Manifest = dict[str, tuple[int, int, str]]


@dataclass(frozen=True, slots=True)
class Changes:
    """What one write-back or restore moved: files and bytes transferred, files deleted."""

    transferred: int = 0
    bytes: int = 0
    deleted: int = 0


class Mirror:
    """The workspaces of ``workspaces`` mirrored into ``objects``."""

    def __init__(self, objects: ObjectStore, workspaces: WorkspaceStore) -> None:
        self.objects = objects
        self._workspaces = workspaces
        layout = StateLayout.of(workspaces.settings)
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

    # --- the manifest ---

    def _manifest_path(self, key: str) -> Path:
        self._workspaces.directory(key)  # checks the key's form
        return self._manifests / f"{key}.json"

    @staticmethod
    def _load(path: Path) -> Manifest:
        try:
            raw = json.loads(path.read_bytes())
            return {str(name): (int(size), int(mtime), str(etag)) for name, (size, mtime, etag) in raw.items()}
        except (FileNotFoundError, ValueError, TypeError, AttributeError):
            return {}  # none yet, or torn by a crash: everything counts as changed

    def _save(self, path: Path, manifest: Manifest) -> None:
        try:
            self._manifests.mkdir(mode=0o700, exist_ok=True)
            temporary = path.with_name(f".{os.getpid()}-{secrets.token_hex(6)}")
            fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
            with os.fdopen(fd, "w", encoding="utf-8") as out:
                out.write(json.dumps(manifest))
            temporary.replace(path)
        except OSError as exc:
            raise disk_error(exc, "cannot record what the object store holds") from exc

    # --- the local side ---

    def _open_root(self, key: str) -> int | None:
        try:
            return os.open(self._workspaces.directory(key), DIR_FLAGS)
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise WorkspaceError(f"the conversation's workspace cannot be opened: {exc.strerror}") from exc

    @staticmethod
    def _local(root: int) -> dict[str, os.stat_result]:
        walk = Walk(root, max_depth=MAX_DEPTH, max_entries=MAX_LIST_ENTRIES, servable_only=True)
        return {"/".join(parts): info for parts, info in walk}

    # --- write-back ---

    def write_back(self, key: str, fence: Check = unfenced) -> Changes:
        """Upload conversation ``key``'s changed files, delete the objects of removed ones; ``fence()``
        checks that this replica still holds the lease, before anything is put and before the manifest.

        Raises:
            LeaseLostError: ``fence`` found the lease lost. WorkspaceError: the workspace cannot be read, or
                the store refused (the manifest keeps what reached the store: the next write-back does the rest).
        """
        with self._lock(key):
            root = self._open_root(key)
            if root is None:
                return Changes()
            try:
                return self._write_back(root, self._under(key), self._manifest_path(key), fence)
            finally:
                os.close(root)

    def _write_back(self, root: int, under: str, manifest_path: Path, fence: Check = unfenced) -> Changes:
        manifest = self._load(manifest_path)
        local = self._local(root)
        changed = [
            (name, info)
            for name, info in local.items()
            if manifest.get(name, (-1, -1, ""))[:2] != (info.st_size, info.st_mtime_ns)
        ]
        gone = [name for name in manifest if name not in local]
        if not changed and not gone:
            return Changes()  # the manifest stays as it is: rewriting it is most of a write-back's cost
        fence()

        def upload(item: tuple[str, os.stat_result]) -> tuple[str, tuple[int, int, str]] | None:
            name, info = item
            try:
                opened = open_file_in(os.dup(root), name)
            except WorkspaceError:
                return None  # removed or replaced by a symlink meanwhile: the next write-back sees it
            with opened, os.fdopen(os.dup(opened.fd), "rb") as body:
                etag = self.objects.put(under + name, body)
            return name, (info.st_size, info.st_mtime_ns, etag)

        try:
            for done in self.objects.parallel(upload, changed):
                if done is not None:
                    manifest[done[0]] = done[1]
            if gone:
                self.objects.delete(under + name for name in gone)
                for name in gone:
                    del manifest[name]
        except BaseException:
            self._save(manifest_path, manifest)
            raise
        fence()  # the lease lost meanwhile: no manifest (what was put is the new owner's to account for)
        self._save(manifest_path, manifest)
        return Changes(len(changed), sum(info.st_size for _, info in changed), len(gone))

    # --- restore ---

    def restore(self, key: str, tenant: str | None) -> Changes:
        """Make conversation ``key``'s directory (``tenant``'s) equal to the store's copy.

        Raises:
            WorkspaceError: the directory cannot be made or written, or the store refused.
        """
        with self._lock(key):
            return self._restore_key(key, tenant)

    def restore_new(self, key: str, tenant: str | None) -> Changes:
        """:meth:`restore` conversation ``key`` unless this server has its directory already, then
        make the directory; one caller at a time per conversation.

        Concurrent first requests of a conversation each found no directory and each restored: a
        later restore removed, as extras the store lacked, files an earlier request had stored
        meanwhile and not yet written back (acknowledged files lost, and their room in the quota
        given again).

        Raises:
            WorkspaceError: see :meth:`restore`.
        """
        with self._lock(key):
            if self._workspaces.directory(key).is_dir():
                return Changes()
            changes = self._restore_key(key, tenant)
            self._workspaces.ensure(key, tenant)
            return changes

    def _restore_key(self, key: str, tenant: str | None) -> Changes:
        remote = {item.name: item for item in self.objects.list(self._under(key))}
        if not remote and not self._workspaces.directory(key).is_dir():
            return Changes()  # a new conversation: no directory made for nothing
        self._workspaces.ensure(key, tenant)
        root = self._open_root(key)
        if root is None:
            raise WorkspaceError("the conversation's workspace vanished while it was restored")
        try:
            return self._restore(root, self._under(key), self._manifest_path(key), remote)
        finally:
            os.close(root)

    def _restore(self, root: int, under: str, manifest_path: Path, remote: dict[str, StoredObject]) -> Changes:
        manifest = self._load(manifest_path)
        local = self._local(root)
        info = os.fstat(root)
        owner = (info.st_uid, info.st_gid) if os.geteuid() == 0 else None
        wanted: list[StoredObject] = []
        for item in remote.values():
            have, known = local.get(item.name), manifest.get(item.name)
            if have is not None and known == (have.st_size, have.st_mtime_ns, item.etag):
                continue
            wanted.append(item)
        extras = [name for name in local if name not in remote]
        fetched = {item.name for item in wanted}
        fresh: Manifest = {name: entry for name, entry in manifest.items() if name in remote and name not in fetched}

        try:
            staging = os.open(self._staging, DIR_FLAGS)
        except OSError as exc:
            raise disk_error(exc, "cannot restore the workspace") from exc

        def download(item: StoredObject) -> tuple[str, tuple[int, int, str]]:
            return item.name, self._download(under, root, staging, item.name, owner)

        try:
            for name, entry in self.objects.parallel(download, wanted):
                fresh[name] = entry
            for name in extras:
                unlink_in(root, name)
        finally:
            os.close(staging)
            self._save(manifest_path, fresh)
        return Changes(len(wanted), sum(item.size for item in wanted), len(extras))

    def _download(
        self, under: str, root: int, staging: int, name: str, owner: tuple[int, int] | None
    ) -> tuple[int, int, str]:
        """Fetch object ``name`` into the workspace (a temporary file in ``uploads/`` renamed into place)."""
        try:
            check_filename(name)
        except ValidationError as exc:
            raise WorkspaceError(f"the object store holds a file under an unacceptable name: {exc}") from None
        temporary = f"{os.getpid()}-{secrets.token_hex(12)}"
        try:
            flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
            with os.fdopen(os.open(temporary, flags, 0o600, dir_fd=staging), "wb") as into:
                renamed = False
                try:
                    etag = self.objects.get(under + name, into)
                    into.flush()
                    os.fchmod(into.fileno(), 0o600)
                    if owner is not None:
                        os.fchown(into.fileno(), *owner)
                    parent = open_parent(root, name, create=True, owner=owner)
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
                return self._write_back(root, under, manifest)
            finally:
                os.close(root)

    def pull(self, directory: Path) -> Changes:
        """Make a tenant's library directory equal to the store's copy (before a run reads it).

        Raises:
            WorkspaceError: the store or the disk refused.
        """
        under, manifest = self._library(directory)
        with self._lock(under):
            remote = {item.name: item for item in self.objects.list(under)}
            if not remote and not directory.is_dir():
                return Changes()
            try:
                directory.mkdir(mode=0o700, parents=True, exist_ok=True)
                root = os.open(directory, DIR_FLAGS)
            except OSError as exc:
                raise disk_error(exc, "the library cannot be written") from exc
            try:
                return self._restore(root, under, manifest, remote)
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
        try:
            with os.fdopen(os.dup(fd), "wb") as into:
                self.objects.get(self._under(key) + name, into)
        except FileNotFoundError:
            os.close(fd)
            raise WorkspaceError(f"{name}: no such file in the workspace") from None
        except BaseException:
            os.close(fd)
            raise
        return OpenFile(fd=fd, name=name, size=os.fstat(fd).st_size, mtime=time.time())

    # --- the earlier code runner's permanent links ---

    def record_link(self, digest: str, key: str) -> None:
        """Write back conversation ``key`` (the earlier runner's data just adopted into it) and record
        that the runner's links ``/files/{digest}/…`` are its files, so every replica serves them.

        Raises:
            WorkspaceError: ``digest`` or ``key`` is not of its form, or the store refused.
        """
        self.write_back(key)
        self.objects.put(_link(digest), key.encode("ascii"))

    def linked(self, digest: str) -> str | None:
        """The conversation whose files the runner's links ``/files/{digest}/…`` are, if one was recorded.

        Raises:
            WorkspaceError: ``digest`` is not of its form, the store refused, or holds no key there.
        """
        into = io.BytesIO()
        try:
            self.objects.get(_link(digest), into)
        except FileNotFoundError:
            return None
        key = into.getvalue().decode("ascii", errors="replace")
        self._workspaces.directory(key)  # checks the key's form
        return key

    def forget(self, key: str) -> None:
        """Delete conversation ``key``'s objects and manifest (retention, a deleted conversation).

        Raises:
            WorkspaceError: the store refused.
        """
        with self._lock(key):
            names = [item.name for item in self.objects.list(self._under(key))]
            if names:
                self.objects.delete(self._under(key) + name for name in names)
            with contextlib.suppress(FileNotFoundError):
                self._manifest_path(key).unlink()
        self._locks.pop(key, None)  # a conversation deleted: its lock goes too


def _link(digest: str) -> str:
    if not _DIGEST_RE.match(digest):
        raise WorkspaceError("not a link of the earlier runner")
    return f"runner-links/{digest}"
