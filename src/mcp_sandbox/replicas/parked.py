"""Parked sessions' states in the object store, at ``prefix/parked/<key>.state``: what a replica
taking a conversation over resumes (``engine/parking.py`` signs and checks them; the store only
keeps the bytes)."""

from __future__ import annotations

import os
from pathlib import Path

from mcp_sandbox.replicas.objects import ObjectStore

__all__ = ["StoredParked"]


class StoredParked:
    """The object store's copies of parked states (a :class:`~mcp_sandbox.engine.parking.ParkedCopies`)."""

    def __init__(self, objects: ObjectStore) -> None:
        self._objects = objects

    @staticmethod
    def _name(key: str) -> str:
        return f"parked/{key}.state"

    def upload(self, key: str, path: Path) -> None:
        """Store the file ``path`` as ``key``'s parked state.

        Raises:
            WorkspaceError: the store refused or could not be reached.
        """
        with open(path, "rb") as body:
            self._objects.put(self._name(key), body)

    def download(self, key: str, path: Path) -> bool:
        """Write ``key``'s stored state to the new file ``path`` (0600); False if the store has none.

        Raises:
            WorkspaceError: the store refused or could not be reached.
        """
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        with open(os.open(path, flags, 0o600), "wb") as into:
            try:
                self._objects.get(self._name(key), into)
            except FileNotFoundError:
                return False
        return True

    def delete(self, key: str) -> None:
        """Delete ``key``'s stored state, if any.

        Raises:
            WorkspaceError: the store refused or could not be reached.
        """
        self._objects.delete([self._name(key)])
