"""A conversation's workspace mirrored to the object store, under ``prefix/workspaces/<key>/``.

:meth:`Mirror.write_back` uploads the files that changed since the last write-back or restore
and deletes what is gone: a manifest per workspace (``state_dir/mirror/<key>.json``: size,
``st_mtime_ns`` and ETag or pack of each file) tells what changed without reading any file.
Small files go into packs named by an index (:mod:`.packs`: a thousand small files restore in a
few requests), large ones are an object each, at ``<key>/<name>`` as before packs; a file the
store could not take is that file's failure (:mod:`.upkeep`), and the index is written only by
the conversation's lease holder (:mod:`.indexing`). :meth:`Mirror.restore` makes the local
directory equal to the store's copy. What is mirrored is what the listing serves: regular files
under acceptable names, read and written through the no-follow helpers (:mod:`.transfers`),
owned by the tenant's host uid. The earlier runner's links name their conversation in
:mod:`.links`. Transfers run on the store's threads; the methods block.
"""

from __future__ import annotations

import contextlib
import functools
import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from mcp_sandbox.errors import WorkspaceError
from mcp_sandbox.replicas import indexing
from mcp_sandbox.replicas.checkpoints import forget_checkpoints
from mcp_sandbox.replicas.indexing import stop_point
from mcp_sandbox.replicas.links import link_name
from mcp_sandbox.replicas.objects import ObjectStore, StoredObject
from mcp_sandbox.replicas.packs import (
    INDEX,
    PACKS,
    Index,
    Manifest,
    batches,
    is_pack_tag,
    load_manifest,
    repack,
    save_manifest,
    untag,
)
from mcp_sandbox.replicas.parked import StoredParked
from mcp_sandbox.replicas.transfers import Placer, read_index, read_pack, write_file, write_pack
from mcp_sandbox.replicas.upkeep import index_to_update, keep_stored, reads_index, restorable, split
from mcp_sandbox.workspace import OpenFile, WorkspaceStore, check_filename
from mcp_sandbox.workspace.checkpoints import checkpoint_names
from mcp_sandbox.workspace.fencing import Check, unfenced
from mcp_sandbox.workspace.files import DIR_FLAGS, Walk, disk_error, unlink_in
from mcp_sandbox.workspace.store import MAX_DEPTH, MAX_LIST_ENTRIES

__all__ = ["Changes", "Mirror"]

_RESTORE_ATTEMPTS = 3  # an earlier owner's index landing during a restore: read again


@dataclass(frozen=True, slots=True)
class Changes:
    """What one write-back or restore moved: files and bytes sent, files deleted, not stored, not restored."""

    transferred: int = 0
    bytes: int = 0
    deleted: int = 0
    unsaved: tuple[str, ...] = ()
    lost: tuple[str, ...] = ()


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

    @staticmethod
    def _local(root: int) -> dict[str, os.stat_result]:
        walk = Walk(root, max_depth=MAX_DEPTH, max_entries=MAX_LIST_ENTRIES, servable_only=True)
        return {"/".join(parts): info for parts, info in walk}

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
                return self._write_back(root, under, manifest, packed=True, fence=fence, epoch=epoch)
            finally:
                os.close(root)

    def _write_back(
        self, root: int, under: str, manifest_path: Path, *, packed: bool, fence: Check = unfenced, epoch: int = 0
    ) -> Changes:
        manifest = load_manifest(manifest_path)
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
        touched = [*gone, *dict(changed)]
        index, damaged = Index(), False
        if packed and reads_index(self.objects, under, manifest, changed, touched):
            index, damaged = index_to_update(self.objects, under)  # the store's: a packed file changed or went
        changed = list(local.items()) if damaged else changed  # rebuilt from this copy: every file sent again
        small, large = split(self.objects, under, changed, packed=packed)
        after = index.copy()
        for name in touched:
            after.files.pop(name, None)
        small += repack(after, manifest, local)

        jobs = [functools.partial(write_file, self.objects, root, under, item) for item in large]
        jobs += [functools.partial(write_pack, self.objects, root, under, self._staging, b) for b in batches(small)]
        stored = list(self.objects.parallel(lambda job: job(), jobs))
        unsaved = sorted({name for *_, names in stored for name in names})
        for pack, size, entries, _ in stored:
            if pack is not None:
                after.packs[pack] = size
            for name, entry in entries:
                if is_pack_tag(entry[2]):
                    after.files[name] = (*untag(entry[2]), entry[0])
        keep_stored(after, index, unsaved)
        dead = after.unused()
        for pack in dead:
            del after.packs[pack]
        superseded = [under + name for name in gone if not is_pack_tag(manifest[name][2])]
        # Objects of files now packed, and packs no file uses: deleted once the index no longer needs them.
        superseded += [under + name for name in after.files if not is_pack_tag(manifest.get(name, (0, 0, "pack:"))[2])]
        superseded += [under + pack for pack in dead]
        fence()  # the lease lost meanwhile: no index, no manifest (what was put is the new owner's to account for)
        if after != index or damaged:
            # The packs it names are stored: from here on they are the workspace's files.
            if after.files or epoch:  # a replica's empty index stays: it keeps the epoch (see .indexing)
                stop_point(touched)
                indexing.replace(self.objects, under, index, after, epoch, fence)
            else:
                superseded.append(under + INDEX)
        try:
            for name in gone:
                del manifest[name]
            manifest.update(entry for _, _, entries, _ in stored for entry in entries)
            if superseded:
                self.objects.delete(superseded)
        finally:
            save_manifest(manifest_path, manifest)
        sent = [info.st_size for name, info in changed if name not in unsaved]
        return Changes(len(sent), sum(sent), len(gone), unsaved=tuple(unsaved))

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
            return self._restore(root, self._under(key), self._manifest_path(key), listed, packed=True, epoch=epoch)
        finally:
            os.close(root)

    def _restore(
        self, root: int, under: str, manifest_path: Path, listed: list[StoredObject], *, packed: bool, epoch: int = 0
    ) -> Changes:
        manifest = load_manifest(manifest_path)
        index, lost, orphans = restorable(self.objects, under, listed) if packed else (Index(), [], set[str]())
        kept = {item.name: item for item in listed if not (packed and item.name.startswith(PACKS))}
        if orphans:  # packs no index names: swept only once older than the grace (an older owner's may land)
            listed_orphans = (item for item in listed if item.name in orphans)
            orphans = set(indexing.aged(listed_orphans, self._grace, time.time()))
        shadowed = [name for name in kept if name in index.files]  # an older copy the index replaced
        remote = {name: (item.size, item.etag) for name, item in kept.items()}
        remote |= {name: (length, index.tag(name)) for name, (_, _, length) in index.files.items()}
        local = self._local(root)
        info = os.fstat(root)
        owner = (info.st_uid, info.st_gid) if os.geteuid() == 0 else None
        wanted: list[str] = []
        for name, (_, tag) in remote.items():
            have, known = local.get(name), manifest.get(name)
            if have is None or known != (have.st_size, have.st_mtime_ns, tag):
                wanted.append(name)
        extras = [name for name in local if name not in remote] if orphans is not None else []  # damaged: kept
        fetched = set(wanted)
        fresh: Manifest = {name: entry for name, entry in manifest.items() if name in remote and name not in fetched}
        by_pack: dict[str, list[str]] = {}
        for name in wanted:
            if name in index.files:
                by_pack.setdefault(index.files[name][0], []).append(name)

        try:
            staging = os.open(self._staging, DIR_FLAGS)
        except OSError as exc:
            raise disk_error(exc, "cannot restore the workspace") from exc
        place = functools.partial(Placer, root, staging, owner)

        def download(name: str) -> list[tuple[str, tuple[int, int, str]]]:
            return [(name, place(name).fill(lambda into: self.objects.get(under + name, into)))]

        def unpack(pack: str) -> list[tuple[str, tuple[int, int, str]]]:
            return read_pack(self.objects, under, pack, index, by_pack[pack], place)

        jobs = [functools.partial(download, name) for name in wanted if name not in index.files]
        jobs += [functools.partial(unpack, pack) for pack in by_pack]
        try:
            for entries in self.objects.parallel(lambda job: job(), jobs):
                fresh.update(entries)
            for name in extras:
                unlink_in(root, name)
            if packed and epoch and orphans is not None:  # damaged: the owner's next write-back rebuilds it
                indexing.seal(self.objects, under, index, epoch)  # before the sweep: no older index lands after it
            if orphans or shadowed:
                # Left by a write-back that never finished, or replaced by the index: nothing names them.
                with contextlib.suppress(WorkspaceError):
                    self.objects.delete([under + name for name in (*(orphans or ()), *shadowed)])
        finally:
            os.close(staging)
            save_manifest(manifest_path, fresh)
        return Changes(len(wanted), sum(remote[name][0] for name in wanted), len(extras), lost=tuple(lost))

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
                return self._write_back(root, under, manifest, packed=False)
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
                return self._restore(root, under, manifest, listed, packed=False)
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
