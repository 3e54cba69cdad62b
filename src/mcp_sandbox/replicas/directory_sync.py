"""A directory and its copy in the object store made equal, either way, by a manifest of what was sent.

:func:`write_back_directory` uploads the files that changed since the last write-back or restore
and deletes what is gone: the manifest (size, ``st_mtime_ns`` and ETag or pack of each file) tells
what changed without reading any file. Small files go into packs named by an index (:mod:`.packs`),
large ones are an object each; a file the store could not take is that file's failure
(:mod:`.upkeep`), and the index is written under the caller's fence (:mod:`.indexing`).
:func:`restore_directory` makes the directory equal to the store's copy. What is sent is what the
listing serves: regular files under acceptable names, through the no-follow helpers
(:mod:`.transfers`). The caller (:mod:`.mirror`) says which directory, under which prefix, and holds
its lock; the functions block.
"""

from __future__ import annotations

import contextlib
import functools
import os
import time
from dataclasses import dataclass
from pathlib import Path

from mcp_sandbox.errors import WorkspaceError
from mcp_sandbox.replicas import indexing
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
from mcp_sandbox.replicas.transfers import Placer, read_pack, write_file, write_pack
from mcp_sandbox.replicas.upkeep import index_to_update, keep_stored, reads_index, restorable, split
from mcp_sandbox.workspace.fencing import Check, unfenced
from mcp_sandbox.workspace.files import DIR_FLAGS, Walk, disk_error, unlink_in
from mcp_sandbox.workspace.store import MAX_DEPTH, MAX_LIST_ENTRIES

__all__ = ["Changes", "restore_directory", "write_back_directory"]


@dataclass(frozen=True, slots=True)
class Changes:
    """What one write-back or restore moved: files and bytes sent, files deleted, not stored, not restored."""

    transferred: int = 0
    bytes: int = 0
    deleted: int = 0
    unsaved: tuple[str, ...] = ()
    lost: tuple[str, ...] = ()


def _local(root: int) -> dict[str, os.stat_result]:
    walk = Walk(root, max_depth=MAX_DEPTH, max_entries=MAX_LIST_ENTRIES, servable_only=True)
    return {"/".join(parts): info for parts, info in walk}


def write_back_directory(
    objects: ObjectStore,
    staging: Path,
    root: int,
    under: str,
    manifest_path: Path,
    *,
    packed: bool,
    fence: Check = unfenced,
    epoch: int = 0,
) -> Changes:
    """Upload what changed in directory ``root`` since ``manifest_path`` was written, under ``under``,
    and delete the objects of what is gone (small files in packs when ``packed``); ``fence()`` is
    checked before anything is put, and before and after the index (:mod:`.indexing`).

    Raises:
        LeaseLostError: ``fence`` found the lease lost. WorkspaceError: the directory cannot be read,
            or the store refused (the manifest keeps what reached the store).
    """
    manifest = load_manifest(manifest_path)
    local = _local(root)
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
    if packed and reads_index(objects, under, manifest, changed, touched):
        index, damaged = index_to_update(objects, under)  # the store's: a packed file changed or went
    changed = list(local.items()) if damaged else changed  # rebuilt from this copy: every file sent again
    small, large = split(objects, under, changed, packed=packed)
    after = index.copy()
    for name in touched:
        after.files.pop(name, None)
    small += repack(after, manifest, local)

    jobs = [functools.partial(write_file, objects, root, under, item) for item in large]
    jobs += [functools.partial(write_pack, objects, root, under, staging, b) for b in batches(small)]
    stored = list(objects.parallel(lambda job: job(), jobs))
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
            indexing.replace(objects, under, index, after, epoch, fence, touched)
        else:
            superseded.append(under + INDEX)
    try:
        for name in gone:
            del manifest[name]
        manifest.update(entry for _, _, entries, _ in stored for entry in entries)
        if superseded:
            objects.delete(superseded)
    finally:
        save_manifest(manifest_path, manifest)
    sent = [info.st_size for name, info in changed if name not in unsaved]
    return Changes(len(sent), sum(sent), len(gone), unsaved=tuple(unsaved))


def restore_directory(
    objects: ObjectStore,
    staging_dir: Path,
    grace: float,
    root: int,
    under: str,
    manifest_path: Path,
    listed: list[StoredObject],
    *,
    packed: bool,
    epoch: int = 0,
) -> Changes:
    """Make directory ``root`` equal to the store's copy under ``under`` (``listed``), and mark its index
    with ``epoch`` before sweeping packs no index names once ``grace`` seconds old.

    Raises:
        WorkspaceError: the directory cannot be written, or the store refused.
        LeaseLostError: a later epoch wrote the index. indexing.IndexMoved: an earlier owner's index landed meanwhile.
    """
    manifest = load_manifest(manifest_path)
    index, lost, orphans = restorable(objects, under, listed) if packed else (Index(), [], set[str]())
    kept = {item.name: item for item in listed if not (packed and item.name.startswith(PACKS))}
    if orphans:  # packs no index names: swept only once older than the grace (an older owner's may land)
        listed_orphans = (item for item in listed if item.name in orphans)
        orphans = set(indexing.aged(listed_orphans, grace, time.time()))
    shadowed = [name for name in kept if name in index.files]  # an older copy the index replaced
    remote = {name: (item.size, item.etag) for name, item in kept.items()}
    remote |= {name: (length, index.tag(name)) for name, (_, _, length) in index.files.items()}
    local = _local(root)
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
        staging = os.open(staging_dir, DIR_FLAGS)
    except OSError as exc:
        raise disk_error(exc, "cannot restore the workspace") from exc
    place = functools.partial(Placer, root, staging, owner)

    def download(name: str) -> list[tuple[str, tuple[int, int, str]]]:
        return [(name, place(name).fill(lambda into: objects.get(under + name, into)))]

    def unpack(pack: str) -> list[tuple[str, tuple[int, int, str]]]:
        return read_pack(objects, under, pack, index, by_pack[pack], place)

    jobs = [functools.partial(download, name) for name in wanted if name not in index.files]
    jobs += [functools.partial(unpack, pack) for pack in by_pack]
    try:
        for entries in objects.parallel(lambda job: job(), jobs):
            fresh.update(entries)
        for name in extras:
            unlink_in(root, name)
        if packed and epoch and orphans is not None:  # damaged: the owner's next write-back rebuilds it
            indexing.seal(objects, under, index, epoch)  # before the sweep: no older index lands after it
        if orphans or shadowed:
            # Left by a write-back that never finished, or replaced by the index: nothing names them.
            with contextlib.suppress(WorkspaceError):
                objects.delete([under + name for name in (*(orphans or ()), *shadowed)])
    finally:
        os.close(staging)
        save_manifest(manifest_path, fresh)
    return Changes(len(wanted), sum(remote[name][0] for name in wanted), len(extras), lost=tuple(lost))
