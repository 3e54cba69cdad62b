"""Checkpoints' files in the object store, one tar archive each at ``prefix/checkpoints/<key>/<name>.tar``:
what a replica that takes a conversation over restores a checkpoint from (``workspace/checkpoints.py``
keeps them on disk; their variables travel as parked states, ``replicas/parked.py``).

One object per checkpoint, written once and read whole: a checkpoint is never changed in place,
only saved over, so the per-file manifests the mirror keeps for live workspaces buy nothing here.
The standard library's ``tarfile`` writes and reads it; an archive is extracted with its
``data`` filter (no absolute or escaping names or links, no devices, no set-id bits), every entry
the server's own (the copy into a workspace gives them to the tenant's uid, as a fork's does).
"""

from __future__ import annotations

import os
import tarfile
import tempfile
from collections.abc import Iterable
from pathlib import Path

from mcp_sandbox.errors import WorkspaceError
from mcp_sandbox.replicas.objects import ObjectStore
from mcp_sandbox.replicas.parked import StoredParked
from mcp_sandbox.workspace.checkpoints import state_key

__all__ = ["StoredCheckpoints", "forget_checkpoints"]

_SUFFIX = ".tar"


def _own(member: tarfile.TarInfo, path: str) -> tarfile.TarInfo:
    """The ``data`` filter, and every entry the server's (never the uid an archive names)."""
    checked = tarfile.data_filter(member, path)
    return checked.replace(uid=os.geteuid(), gid=os.getegid(), uname="", gname="", deep=False)


class StoredCheckpoints:
    """The object store's copies of checkpoints' files (a ``workspace.checkpoints.CheckpointCopies``)."""

    def __init__(self, objects: ObjectStore) -> None:
        self._objects = objects

    @staticmethod
    def _under(key: str) -> str:
        return f"checkpoints/{key}/"

    def upload(self, key: str, name: str, directory: Path) -> None:
        """Store ``directory`` (a checkpoint's files) as ``key``'s checkpoint ``name``.

        Raises:
            WorkspaceError: the store refused or could not be reached, or the files could not be read.
        """
        try:
            archive = tempfile.TemporaryFile()
        except OSError as exc:
            raise WorkspaceError(f"the checkpoint's files cannot be archived: {exc.strerror}") from exc
        with archive:
            try:
                with tarfile.open(fileobj=archive, mode="w") as tar:
                    tar.add(directory, arcname=".", recursive=True)
            except (OSError, tarfile.TarError) as exc:
                raise WorkspaceError(f"the checkpoint's files cannot be archived: {exc}") from exc
            archive.seek(0)
            self._objects.put(self._under(key) + name + _SUFFIX, archive)

    def download(self, key: str, name: str, directory: Path) -> bool:
        """Extract ``key``'s stored checkpoint ``name`` into the new directory ``directory``; False if none.

        Raises:
            WorkspaceError: the store refused or could not be reached, or the archive is not one.
        """
        try:
            archive = tempfile.TemporaryFile()
        except OSError as exc:
            raise WorkspaceError(f"the stored checkpoint {name!r} cannot be fetched: {exc.strerror}") from exc
        with archive:
            try:
                self._objects.get(self._under(key) + name + _SUFFIX, archive)
            except FileNotFoundError:
                return False
            archive.seek(0)
            try:
                os.mkdir(directory, 0o700)
                with tarfile.open(fileobj=archive, mode="r:") as tar:
                    tar.extractall(directory, numeric_owner=True, filter=_own)
            except (OSError, tarfile.TarError) as exc:
                raise WorkspaceError(f"the stored checkpoint {name!r} cannot be restored: {exc}") from exc
        return True

    def names(self, key: str) -> list[str]:
        """The names of ``key``'s stored checkpoints, sorted.

        Raises:
            WorkspaceError: the store refused or could not be reached.
        """
        found = (item.name for item in self._objects.list(self._under(key)))
        return sorted(name.removesuffix(_SUFFIX) for name in found if name.endswith(_SUFFIX) and "/" not in name)

    def delete(self, key: str, names: Iterable[str]) -> None:
        """Delete ``key``'s stored checkpoints ``names``, if there.

        Raises:
            WorkspaceError: the store refused or could not be reached.
        """
        self._objects.delete(self._under(key) + name + _SUFFIX for name in names)


def forget_checkpoints(objects: ObjectStore, key: str, here: Iterable[str]) -> None:
    """Delete every checkpoint of ``key`` from the store, files and variables (a deleted conversation);
    ``here``: the names this replica holds, beside those the store lists.

    Raises:
        WorkspaceError: the store refused or could not be reached.
    """
    stored = StoredCheckpoints(objects)
    names = sorted({*stored.names(key), *here})
    stored.delete(key, names)
    for name in names:
        StoredParked(objects).delete(state_key(key, name))
