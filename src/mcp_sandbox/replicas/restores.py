"""A conversation's files restored from the object store once per lease epoch, every call of that epoch waiting for it.

A replica that takes a conversation's lease makes its local copy equal to the store's before
running anything of it. Calls of the conversation arriving together must not each restore, nor
run beside the restore: a restore removes local files the store lacks, and a file an upload
has just written is not in the store until its write-back, so a second restore (or a write
during the first) would delete an acknowledged file and let the usage the quota counts drop.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Collection
from dataclasses import dataclass

import anyio

__all__ = ["Restores"]

# Past this many remembered keys, those whose lease this replica no longer holds are forgotten.
_REMEMBERED = 10_000


@dataclass
class _Restore:
    epoch: int
    done: anyio.Event
    ok: bool = False


class Restores:
    """Runs ``restore(key, epoch)`` once per (key, epoch); concurrent callers wait for that one run."""

    def __init__(self, restore: Callable[[str, int], Awaitable[None]]) -> None:
        self._restore = restore
        self._entries: dict[str, _Restore] = {}

    async def ready(self, key: str, epoch: int) -> None:
        """Return once ``key``'s files are restored for lease ``epoch`` (restoring them if no call has).

        Raises:
            WorkspaceError: the restore failed (the next call of the epoch tries again).
        """
        while True:
            entry = self._entries.get(key)
            if entry is None or entry.epoch != epoch:
                break
            await entry.done.wait()
            if entry.ok:
                return
            if self._entries.get(key) is entry:  # it failed: this call tries again
                del self._entries[key]
        entry = _Restore(epoch, anyio.Event())
        self._entries[key] = entry
        try:
            await self._restore(key, epoch)
            entry.ok = True
        finally:
            if not entry.ok and self._entries.get(key) is entry:
                del self._entries[key]
            entry.done.set()

    def prune(self, held: Collection[str]) -> None:
        """Forget the keys not in ``held`` (the leases held here) once there are many."""
        if len(self._entries) > _REMEMBERED:
            self._entries = {key: entry for key, entry in self._entries.items() if key in held}
