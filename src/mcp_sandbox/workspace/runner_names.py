"""The files a conversation adopted from the earlier runner, by name, size and content hash.

The runner's links ``/files/{digest}/{name}`` are unsigned and permanent: whoever saw one link
knows the digest, and with it could name any file. So they answer only for what was imported:
each adopted file's size and SHA-256 are recorded at adoption (:class:`ImportedNames`), and a
file served by such a link must still have them. A file the conversation wrote later, or an
imported one changed since (even to the same size, with its mtime set back), is not served: its
link is a 404. The content hash, not the inode or mtime, is the identity because the file is
also served by replicas that restored it from the object store (another inode, another mtime),
and because sandboxed code can set an mtime back; a verified ``(device, inode, size, ctime,
mtime)`` is remembered so an unchanged file is hashed once per process, not per download.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
from collections.abc import Iterable, Iterator
from pathlib import Path

from mcp_sandbox.workspace.files import OpenFile

__all__ = ["Hashing", "ImportedNames"]

_CHUNK = 1 << 20
_REMEMBERED = 4096  # verified files kept (a bound: the links are many, the memory is not)


class Hashing:
    """Chunks passed through unchanged while their size and SHA-256 are counted."""

    def __init__(self, chunks: Iterable[bytes]) -> None:
        self._chunks = chunks
        self.size = 0
        self._sha = hashlib.sha256()

    def __iter__(self) -> Iterator[bytes]:
        for chunk in self._chunks:
            self.size += len(chunk)
            self._sha.update(chunk)
            yield chunk

    @property
    def hexdigest(self) -> str:
        return self._sha.hexdigest()


def _identity(info: os.stat_result) -> tuple[int, int, int, int, int]:
    # ctime cannot be set by the file's owner: a change made in place, mtime set back, still shows.
    return info.st_dev, info.st_ino, info.st_size, info.st_ctime_ns, info.st_mtime_ns


class ImportedNames:
    """``name`` → ``(size, sha256 hex)`` of the files adopted from the runner; JSON in a file or object."""

    def __init__(self, files: dict[str, tuple[int, str]]) -> None:
        self.files = files
        self._verified: set[tuple[int, int, int, int, int]] = set()
        self._lock = threading.Lock()

    def to_json(self) -> bytes:
        return json.dumps({name: [size, sha] for name, (size, sha) in sorted(self.files.items())}).encode()

    @classmethod
    def from_json(cls, data: bytes) -> ImportedNames:
        """Raises: ValueError: not such a record."""
        loaded = json.loads(data)
        if not isinstance(loaded, dict):
            raise ValueError("not a record of imported names")
        files: dict[str, tuple[int, str]] = {}
        for name, entry in loaded.items():
            if not (isinstance(entry, list) and len(entry) == 2 and isinstance(entry[0], int)):
                raise ValueError(f"not a record of imported names: {name!r}")
            files[name] = (entry[0], str(entry[1]))
        return cls(files)

    def save(self, path: Path) -> None:
        """Write to ``path`` atomically (a crash leaves the old record or none, never half of one)."""
        partial = path.with_name(f".{path.name}.tmp")
        partial.write_bytes(self.to_json())
        partial.replace(path)

    @classmethod
    def load(cls, path: Path) -> ImportedNames | None:
        """The record at ``path``; None when there is none (or it cannot be read: the links fail closed)."""
        try:
            return cls.from_json(path.read_bytes())
        except (OSError, ValueError):
            return None

    def serves(self, opened: OpenFile) -> bool:
        """Whether ``opened`` is the file imported under its name, unchanged (size and content)."""
        entry = self.files.get(opened.name)
        if entry is None:
            return False
        size, sha = entry
        info = os.fstat(opened.fd)
        if info.st_size != size or opened.size != size:
            return False
        identity = _identity(info)
        with self._lock:
            if identity in self._verified:
                return True
        digest = hashlib.sha256()
        offset = 0
        while chunk := os.pread(opened.fd, _CHUNK, offset):
            digest.update(chunk)
            offset += len(chunk)
        if offset != size or digest.hexdigest() != sha or _identity(os.fstat(opened.fd)) != identity:
            return False
        with self._lock:
            if len(self._verified) >= _REMEMBERED:
                self._verified.clear()
            self._verified.add(identity)
        return True
