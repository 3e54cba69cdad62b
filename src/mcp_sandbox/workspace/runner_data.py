"""The earlier code runner's data: imported from its ``SANDBOX_ROOT``, adopted by its conversation.

That runner kept a conversation's files in ``{SANDBOX_ROOT}/{sha256(conversationId + FILE_SECRET)}/``
(hex digest) and linked them, permanently and unsigned, as ``/files/{digest}/{name}``. The id cannot
be recovered from the digest, so :meth:`RunnerData.import_all` copies each such directory under the
state directory, keyed by its digest (regular files and directories; symlinks and other files are
skipped and counted). The first call of tenant ``default`` (the one that runner's token becomes)
naming a conversation whose digest matches adopts those files into its workspace (:meth:`adopt`),
and digest → workspace key is kept so the old links keep answering (:meth:`open_file`), for the
adopted files only: their names, sizes and hashes are kept beside the key (:mod:`.runner_names`),
and a file written later, or changed since, is not served by an old link.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import shutil
import stat
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from mcp_sandbox.config.tokens import DEFAULT_TENANT
from mcp_sandbox.errors import QuotaExceededError, ValidationError, WorkspaceError
from mcp_sandbox.workspace.files import OpenFile, open_file_in
from mcp_sandbox.workspace.names import check_filename
from mcp_sandbox.workspace.runner_names import Hashing, ImportedNames
from mcp_sandbox.workspace.store import WorkspaceStore

__all__ = ["Imported", "RunnerData", "import_runner_data"]

logger = logging.getLogger(__name__)

_DIGEST_RE = re.compile(r"^[0-9a-f]{64}$")
_CHUNK = 1 << 20


@dataclass(frozen=True, slots=True)
class Imported:
    """One conversation directory of the earlier runner: its digest, what was copied and skipped."""

    digest: str
    files: int
    bytes: int
    skipped: int
    already: bool = False


def _walk(directory: Path, prefix: str = "") -> Iterator[tuple[str, Path, os.stat_result | None]]:
    """``(relative name, path, lstat)`` of every entry under ``directory``; a ``None`` stat: skipped."""
    for entry in sorted(os.scandir(directory), key=lambda e: e.name):
        name = f"{prefix}{entry.name}"
        info = entry.stat(follow_symlinks=False)
        if stat.S_ISDIR(info.st_mode):
            yield from _walk(Path(entry.path), f"{name}/")
        elif stat.S_ISREG(info.st_mode):
            yield name, Path(entry.path), info
        else:
            yield name, Path(entry.path), None


def _chunks(src: BinaryIO) -> Iterator[bytes]:
    while chunk := src.read(_CHUNK):
        yield chunk


class RunnerData:
    """The runner's ``root`` and ``secret``; imported directories under ``holding``, adopted into ``store``."""

    def __init__(self, root: Path, secret: str, holding: Path, store: WorkspaceStore) -> None:
        self._root = root
        self._secret = secret
        self._holding = holding
        self._store = store
        self._lock = threading.Lock()
        self._names: dict[str, ImportedNames] = {}

    def digest(self, conversation: str) -> str:
        """The runner's name for ``conversation``'s directory and links."""
        return hashlib.sha256((conversation + self._secret).encode()).hexdigest()

    def import_all(self) -> list[Imported]:
        """Copy every conversation directory of the runner not imported yet; say what was done.

        Raises:
            WorkspaceError: ``root`` cannot be read, or a copy cannot be written.
        """
        try:
            entries = sorted(os.scandir(self._root), key=lambda e: e.name)
        except OSError as exc:
            raise WorkspaceError(f"SANDBOX_ROOT {self._root}: {exc.strerror}") from exc
        self._holding.mkdir(mode=0o700, parents=True, exist_ok=True)
        done = []
        for entry in entries:
            if not _DIGEST_RE.match(entry.name) or not entry.is_dir(follow_symlinks=False):
                continue
            digest = entry.name
            if (self._holding / f"{digest}.key").exists() and not self._names_path(digest).exists():
                self._record_from_source(digest, Path(entry.path))
            if (self._holding / digest).exists() or (self._holding / f"{digest}.key").exists():
                done.append(Imported(digest, 0, 0, 0, already=True))
                continue
            done.append(self._copy(digest, Path(entry.path)))
        return done

    def _copy(self, digest: str, source: Path) -> Imported:
        partial = self._holding / f".{digest}.partial"
        shutil.rmtree(partial, ignore_errors=True)
        files = size = skipped = 0
        try:
            partial.mkdir(mode=0o700)
            for name, path, info in _walk(source):
                if info is None:
                    skipped += 1
                    continue
                target = partial / name
                target.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
                with open(os.open(path, os.O_RDONLY | os.O_NOFOLLOW), "rb") as src, open(target, "xb") as dst:
                    shutil.copyfileobj(src, dst, _CHUNK)
                files, size = files + 1, size + info.st_size
            partial.rename(self._holding / digest)
        except OSError as exc:
            shutil.rmtree(partial, ignore_errors=True)
            raise WorkspaceError(f"importing {digest[:12]}… from SANDBOX_ROOT: {exc.strerror}") from exc
        return Imported(digest, files, size, skipped)

    def _names_path(self, digest: str) -> Path:
        return self._holding / f"{digest}.names"

    def _record_from_source(self, digest: str, source: Path) -> None:
        """Record the names an adoption by an older version took, from ``SANDBOX_ROOT`` (never changed
        by this server): without a record, the old links of an adopted conversation answer nothing."""
        files: dict[str, tuple[int, str]] = {}
        try:
            for name, path, info in _walk(source):
                if info is not None:
                    with open(os.open(path, os.O_RDONLY | os.O_NOFOLLOW), "rb") as src:
                        hashing = Hashing(_chunks(src))
                        for _ in hashing:
                            pass
                    files[name] = (hashing.size, hashing.hexdigest)
        except OSError as exc:
            logger.warning("the earlier runner's links of %s… stay closed: %s", digest[:12], exc)
            return
        ImportedNames(files).save(self._names_path(digest))

    def names_of(self, digest: str) -> ImportedNames | None:
        """The files adopted from ``digest`` (the only ones its old links serve); None before adoption."""
        if not _DIGEST_RE.match(digest):
            return None
        with self._lock:
            names = self._names.get(digest)
            if names is None and (names := ImportedNames.load(self._names_path(digest))) is not None:
                self._names[digest] = names
            return names

    def adopt(self, tenant: str, conversation: str, key: str) -> int:
        """Move the imported files of ``conversation`` (if any, not adopted yet) into workspace ``key``.

        Returns the number of files adopted; a file the workspace refuses (its name, the quota) is
        logged and left out.
        """
        if tenant != DEFAULT_TENANT:
            return 0
        digest = self.digest(conversation)
        directory = self._holding / digest
        with self._lock:
            if not directory.is_dir():
                return 0
            files: dict[str, tuple[int, str]] = {}
            for name, path, info in _walk(directory):
                if info is None:
                    continue
                try:
                    with open(path, "rb") as src:
                        hashing = Hashing(_chunks(src))
                        self._store.write_file(key, name, hashing)
                    files[name] = (hashing.size, hashing.hexdigest)
                except (ValidationError, QuotaExceededError, WorkspaceError) as exc:
                    logger.warning("the earlier runner's file %r of %s… was not adopted: %s", name, digest[:12], exc)
            adopted = len(files)
            ImportedNames(files).save(self._names_path(digest))  # before the key: no adopted link without it
            marker = self._holding / f"{digest}.key"
            marker.with_suffix(".tmp").write_text(key, encoding="utf-8")
            marker.with_suffix(".tmp").replace(marker)
            shutil.rmtree(directory)
        logger.info("adopted %d files of the earlier runner's %s… into a conversation", adopted, digest[:12])
        return adopted

    def key_of(self, digest: str) -> str | None:
        """The workspace key of the conversation that adopted ``digest``'s files here, if one did."""
        if not _DIGEST_RE.match(digest):
            return None
        try:
            return (self._holding / f"{digest}.key").read_text(encoding="utf-8")
        except FileNotFoundError:
            return None

    def open_file(self, digest: str, name: str) -> OpenFile:
        """Open file ``name`` of the runner's link ``/files/{digest}/{name}``, adopted or not yet: an
        imported file, unchanged since (:mod:`.runner_names`), never one written after the import.

        Raises:
            ValidationError: ``name`` is not an acceptable file name.
            WorkspaceError: no such digest imported, or no such file imported, or changed since.
        """
        check_filename(name)
        if not _DIGEST_RE.match(digest):
            raise WorkspaceError("no such file")
        with self._lock:  # adoption moves the directory: look at both in one state
            key = self.key_of(digest)
            if key is None:
                try:
                    root = os.open(self._holding / digest, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
                except OSError as exc:
                    raise WorkspaceError("no such file") from exc
        if key is None:
            return open_file_in(root, name)  # the imported copy itself: only this server writes there
        names = self.names_of(digest)
        if names is None or name not in names.files:
            raise WorkspaceError("no such file")
        opened = self._store.open_file(key, name)
        try:
            if names.serves(opened):
                return opened
        except OSError:
            opened.close()
            raise
        opened.close()
        raise WorkspaceError("no such file")


def import_runner_data(
    root: Path | None, secret: str | None, holding: Path, store: WorkspaceStore
) -> RunnerData | None:
    """The earlier code runner's data when its ``SANDBOX_ROOT`` and ``FILE_SECRET`` are set, imported now.

    Raises:
        WorkspaceError: ``root`` cannot be read, or a copy cannot be written.
    """
    if root is None or secret is None:
        if root is not None or secret is not None:
            logger.warning(
                "SANDBOX_ROOT and FILE_SECRET are needed together to import the earlier runner's data"
                " (FILE_SECRET alone, with an object store: its links are served from the store only)"
            )
        return None
    data = RunnerData(root, secret, holding, store)
    imported = data.import_all()
    fresh = [item for item in imported if not item.already]
    for item in fresh:
        logger.info(
            "imported the earlier runner's conversation %s: %d files, %d bytes, %d skipped (not regular files)",
            item.digest,
            item.files,
            item.bytes,
            item.skipped,
        )
    # At WARNING, the default level: the operator sees that the data was taken over.
    logger.warning(
        "the earlier runner's data in %s: %d conversations imported now (%d files, %d bytes, %d skipped), %d before;"
        " each joins its conversation when tenant default first names it",
        root,
        len(fresh),
        sum(i.files for i in fresh),
        sum(i.bytes for i in fresh),
        sum(i.skipped for i in fresh),
        len(imported) - len(fresh),
    )
    return data
