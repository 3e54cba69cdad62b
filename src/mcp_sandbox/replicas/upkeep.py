"""What keeps a workspace's copy in the store usable: damage found, long names packed, old versions kept.

A write-back that finds the store's index damaged (unreadable, inconsistent, or naming a pack
the store lacks) rebuilds it from the owner's local copy instead of failing on it for ever; a
restore from a damaged index takes every file it still can and names the rest, and leaves the
damaged index's packs for the owner's rebuild. A file whose object key would pass S3's 1,024
bytes goes in a pack whatever its size. A file a write-back could not store keeps its stored
version in the index (the next write-back sends it again).
"""

from __future__ import annotations

import logging
import os

from mcp_sandbox.replicas.objects import ObjectStore, StoredObject
from mcp_sandbox.replicas.packs import INDEX, PACKS, SMALL, DamagedIndex, Index, Manifest, is_pack_tag
from mcp_sandbox.replicas.transfers import index_in_place, key_fits, read_index, salvage_index, stored_packs

__all__ = ["index_to_update", "keep_stored", "reads_index", "restorable", "split"]

logger = logging.getLogger(__name__)

Files = list[tuple[str, os.stat_result]]


def _packs(objects: ObjectStore, under: str, name: str, info: os.stat_result) -> bool:
    """Whether file ``name`` goes in a pack: it is small, or its own object's key would be too long."""
    return info.st_size < SMALL or not key_fits(objects, under + name)


def split(objects: ObjectStore, under: str, changed: Files, *, packed: bool) -> tuple[Files, Files]:
    """``changed`` cut into the files to pack and those stored as objects of their own."""
    if not packed:
        return [], changed
    small = [(name, info) for name, info in changed if _packs(objects, under, name, info)]
    return small, [(name, info) for name, info in changed if not _packs(objects, under, name, info)]


def reads_index(objects: ObjectStore, under: str, manifest: Manifest, changed: Files, touched: list[str]) -> bool:
    """Whether a write-back must read the store's index: a file to pack changed, a packed one changed
    or went, or there is no manifest (what the store holds is not known here)."""
    return (
        not manifest
        or any(_packs(objects, under, *item) for item in changed)
        or any(is_pack_tag(manifest.get(name, (0, 0, ""))[2]) for name in touched)
    )


def index_to_update(objects: ObjectStore, under: str) -> tuple[Index, bool]:
    """The store's index under ``under``, and whether it is damaged: then an empty index with the
    damaged one's ETag and epoch (it is replaced conditionally, :mod:`.indexing`), which the
    write-back fills from the local copy. A LIST of the packs, sent beside the index's GET, checks
    that those it names are there (one could be deleted behind the owner's back).

    Raises:
        WorkspaceError: the store refused.
    """

    def fetch(what: str) -> Index | dict[str, int] | None:
        if what == "packs":
            return stored_packs(objects, under)
        try:
            return read_index(objects, under)
        except DamagedIndex:
            return None

    found, stored = objects.parallel(fetch, ["index", "packs"])
    if isinstance(found, Index) and isinstance(stored, dict) and found.missing(stored):
        return Index(epoch=found.epoch, etag=found.etag), True
    if not isinstance(found, Index) or not isinstance(stored, dict):
        return index_in_place(objects, under), True
    return found, False


def keep_stored(after: Index, before: Index, unsaved: list[str]) -> None:
    """Keep in ``after`` the stored version (in ``before``) of each file whose new one was not saved."""
    for name in unsaved:
        if name in before.files:
            pack = before.files[name][0]
            after.files[name] = before.files[name]
            after.packs[pack] = before.packs[pack]


def restorable(
    objects: ObjectStore, under: str, listed: list[StoredObject]
) -> tuple[Index, list[str], set[str] | None]:
    """For a restore of the objects ``listed`` under ``under``: the index as far as it can be
    restored, the files it names that cannot be (logged), and the packs nothing names, to sweep;
    None where the index is damaged (then the restore sweeps nothing and removes no local file:
    they are what the owner's rebuild, or this replica's as the next owner, starts from).

    Raises:
        WorkspaceError: the store refused.
    """
    packs = {item.name: item.size for item in listed if item.name.startswith(PACKS)}
    if packs.pop(INDEX, None) is None:
        return Index(), [], set(packs)
    salvaged = salvage_index(objects, under, packs)
    if salvaged is None:
        logger.warning("a restore found the object store's index of packed files unreadable under %s", under)
        return Index(), [], None
    index, lost = salvaged
    if lost:
        logger.warning("a restore could not get %d files from a damaged object store: %s", len(lost), lost[:20])
        return index, lost, None
    return index, lost, set(packs) - set(index.packs)
