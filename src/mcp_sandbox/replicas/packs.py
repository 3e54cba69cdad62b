"""The mirror's formats: packs of a workspace's small files, the index naming them, the manifest.

Each object the store serves costs it and the client about the same CPU whatever its size, so a
restore of a thousand small files was bound by requests, not bytes. A write-back therefore puts
the changed files under :data:`SMALL` bytes into packs (objects of up to about
:data:`PACK_BYTES`, the files one after another) under ``<workspace>/.mcp-sandbox-packs/`` (a
name no file can have), and :data:`INDEX` there names each packed file's pack, offset and length;
larger files stay one object each, unless their object's key would pass the store's 1,024 bytes
(a name near the 1,024 bytes a workspace accepts): such a file goes in a pack too, whatever its
size, and is restored under its real name from the index. The index is replaced after the packs
it names are stored and before the answer; packs it no longer names are deleted, and a pack
mostly of superseded files is rewritten from the local copies. Only workspaces are packed: a
conversation has one writer (its lease holder), while a tenant's library is written back by
every replica, file by file. The index records the lease epoch of its writer, and is replaced
only by a conditional write on the ETag it was read with (:mod:`.indexing`): an owner stalled
past its lease cannot replace the index of the replica that took the conversation over.

A pack is in use while a file of the index names it, whatever its size: a pack of empty files
is an empty object. (Counting a pack's live *bytes* deleted such a pack while the index still
named it, and every later read of that index failed.) Empty files keep their pack rather than
going without one so that the index's format, which every replica reads, stays as it was.
An index that cannot be read, or names a pack the store lacks, is :class:`DamagedIndex`: the
owner's next write-back rebuilds it from its local copy, and a restore takes every file it
still can and names the rest.
"""

from __future__ import annotations

import json
import os
import secrets
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from mcp_sandbox.errors import WorkspaceError
from mcp_sandbox.workspace.files import disk_error

__all__ = [
    "INDEX",
    "PACKS",
    "PACK_BYTES",
    "SMALL",
    "DamagedIndex",
    "Index",
    "Manifest",
    "batches",
    "is_pack_tag",
    "load_manifest",
    "new_pack",
    "pack_tag",
    "repack",
    "save_manifest",
    "untag",
]

PACKS = ".mcp-sandbox-packs/"  # the reserved .mcp-sandbox- namespace: never a workspace file's name
INDEX = PACKS + "index.json"
SMALL = 1 << 20  # files under this size are packed
PACK_BYTES = 8 << 20  # a pack is closed once this full: several packs download in parallel
_TAG = "pack:"

# name -> (size, st_mtime_ns, ETag or pack tag): what the store holds for the local file of that size and mtime.
Manifest = dict[str, tuple[int, int, str]]


class DamagedIndex(WorkspaceError):
    """The store's index of packed files is unreadable, inconsistent, or names a pack the store lacks."""


def new_pack() -> str:
    """A fresh pack's object name (relative to the workspace's prefix)."""
    return f"{PACKS}{secrets.token_hex(12)}"


def pack_tag(pack: str, offset: int) -> str:
    """What the manifest records in place of an ETag for a packed file: its pack and offset."""
    return f"{_TAG}{pack}@{offset}"


def is_pack_tag(tag: str) -> bool:
    return tag.startswith(_TAG)


def untag(tag: str) -> tuple[str, int]:
    """The pack and offset a :func:`pack_tag` names."""
    pack, _, offset = tag.removeprefix(_TAG).rpartition("@")
    return pack, int(offset)


@dataclass
class Index:
    """The packed files of a workspace: ``files`` name -> (pack, offset, length), ``packs`` pack -> size;
    ``epoch``, the lease epoch of the replica that wrote it (0: one server), and ``etag``, the
    store's ETag of the object it was read from (None: there was none)."""

    files: dict[str, tuple[str, int, int]] = field(default_factory=dict)
    packs: dict[str, int] = field(default_factory=dict)
    epoch: int = 0
    etag: str | None = field(default=None, compare=False)

    def copy(self) -> Index:
        return Index(dict(self.files), dict(self.packs), self.epoch, self.etag)

    def to_json(self) -> dict[str, object]:
        return {"format": 1, "files": self.files, "packs": self.packs, "epoch": self.epoch}

    def encode(self) -> bytes:
        return json.dumps(self.to_json(), separators=(",", ":")).encode()

    @classmethod
    def from_json(cls, raw: object) -> Index:
        """The index in ``raw`` (decoded JSON).

        Raises:
            DamagedIndex: it is not an index this version reads, or names a pack without its bytes.
        """
        unreadable = DamagedIndex("the object store's index of packed files is unreadable")
        if not isinstance(raw, dict) or raw.get("format") != 1:
            raise unreadable
        try:
            files = {
                str(name): (str(pack), int(offset), int(length))
                for name, (pack, offset, length) in raw["files"].items()
            }
            packs = {str(pack): int(size) for pack, size in raw["packs"].items()}
            epoch = int(raw.get("epoch", 0))  # an index written before epochs were recorded: 0
        except (KeyError, ValueError, TypeError, AttributeError):
            raise unreadable from None
        for pack, offset, length in files.values():
            if not pack.startswith(PACKS) or offset < 0 or length < 0 or offset + length > packs.get(pack, -1):
                raise DamagedIndex("the object store's index of packed files is inconsistent") from None
        return cls(files, packs, epoch)

    @classmethod
    def decode(cls, data: bytes, etag: str | None = None) -> Index:
        """Raises: DamagedIndex: see :meth:`from_json`."""
        try:
            raw = json.loads(data)
        except ValueError:
            raise DamagedIndex("the object store's index of packed files is unreadable") from None
        index = cls.from_json(raw)
        index.etag = etag
        return index

    @classmethod
    def salvage(cls, data: bytes, stored: dict[str, int]) -> tuple[Index, list[str]] | None:
        """What can still be restored of the index ``data``, given the packs ``stored`` (name ->
        size) the store lists: the consistent entries whose pack is there at its size (with the
        index's epoch), and the names of the files it names otherwise; None for an unreadable one."""
        try:
            raw = json.loads(data)
            files, packs = raw["files"], raw["packs"]
            names = [str(name) for name in files]
            epoch = int(raw.get("epoch", 0))
        except (ValueError, TypeError, KeyError, AttributeError):
            return None
        sound, lost = cls(epoch=epoch), []
        for name in names:
            try:
                pack, offset, length = str(files[name][0]), int(files[name][1]), int(files[name][2])
                if length == 0 and offset == 0 and pack not in stored and pack.startswith(PACKS):
                    # An empty file needs no bytes: what an earlier version left when it deleted its empty pack.
                    sound.files[name] = (pack, 0, 0)
                    sound.packs[pack] = 0
                    continue
                size = int(packs[pack])
            except (ValueError, TypeError, KeyError, IndexError, AttributeError):
                lost.append(name)
                continue
            if (
                not pack.startswith(PACKS)
                or offset < 0
                or length < 0
                or offset + length > size
                or stored.get(pack) != size
            ):
                lost.append(name)
                continue
            sound.files[name] = (pack, offset, length)
            sound.packs[pack] = size
        return sound, lost

    def missing(self, stored: dict[str, int]) -> bool:
        """Whether a pack a file names is not among ``stored`` (name -> size) at the size the index says."""
        return any(stored.get(pack) != self.packs[pack] for pack, _, _ in self.files.values())

    def unused(self) -> list[str]:
        """The packs no file names (a pack of empty files is in use: its size says nothing)."""
        named = {pack for pack, _, _ in self.files.values()}
        return [pack for pack in self.packs if pack not in named]

    def live(self) -> dict[str, int]:
        """The bytes of each pack that files of the index still use."""
        used = dict.fromkeys(self.packs, 0)
        for pack, _, length in self.files.values():
            used[pack] = used.get(pack, 0) + length
        return used

    def tag(self, name: str) -> str:
        pack, offset, _ = self.files[name]
        return pack_tag(pack, offset)


def batches(items: Iterable[tuple[str, os.stat_result]]) -> list[list[tuple[str, os.stat_result]]]:
    """``items`` (small files) cut into packs of about :data:`PACK_BYTES` each."""
    found: list[list[tuple[str, os.stat_result]]] = [[]]
    filled = 0
    for name, info in items:
        if filled >= PACK_BYTES:
            found.append([])
            filled = 0
        found[-1].append((name, info))
        filled += info.st_size
    return [batch for batch in found if batch]


def repack(index: Index, manifest: Manifest, local: dict[str, os.stat_result]) -> list[tuple[str, os.stat_result]]:
    """The files to pack again, taken out of ``index``: those of packs less than half used whose
    local copy is the one stored (superseded bytes are not kept for ever)."""
    live = index.live()
    sparse = {pack for pack, size in index.packs.items() if 0 < live[pack] and live[pack] * 2 < size}
    again: list[tuple[str, os.stat_result]] = []
    for name, (pack, _, _) in list(index.files.items()):
        info = local.get(name)
        if (
            pack in sparse
            and info is not None
            and manifest.get(name, (-1, -1, ""))[:2] == (info.st_size, info.st_mtime_ns)
        ):
            del index.files[name]
            again.append((name, info))
    return again


def load_manifest(path: Path) -> Manifest:
    """A workspace's manifest: empty if there is none yet, or it was torn by a crash (then
    everything counts as changed)."""
    try:
        raw = json.loads(path.read_bytes())
        return {str(name): (int(size), int(mtime), str(etag)) for name, (size, mtime, etag) in raw.items()}
    except (FileNotFoundError, ValueError, TypeError, AttributeError):
        return {}


def save_manifest(path: Path, manifest: Manifest) -> None:
    """Replace the manifest at ``path`` (its directory made 0700 if missing).

    Raises:
        WorkspaceError: the disk refused.
    """
    try:
        path.parent.mkdir(mode=0o700, exist_ok=True)
        temporary = path.with_name(f".{os.getpid()}-{secrets.token_hex(6)}")
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            out.write(json.dumps(manifest))
        temporary.replace(path)
    except OSError as exc:
        raise disk_error(exc, "cannot record what the object store holds") from exc
