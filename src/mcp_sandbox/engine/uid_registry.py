"""What the engine keeps per tenant host uid: made on the uid's first use, retired after ``pool_idle`` unused.

:class:`UidRegistry` holds one item per host uid other than ``sandbox_uid`` (whose pools the
caller keeps for the engine's life): :meth:`UidRegistry.use` makes the uid's item on its first
use and starts keeping it (the ``keep`` context entered in the registry's task group), counts the
uses in progress, and a loop retires each item no use has touched for ``idle_for``: the ``keep``
context is left (what it does on the way out is the item's retirement). The warm and pre-started
pools (:mod:`.pools_by_uid`) and the session-ready pools (:mod:`.ready_by_uid`) are kept this way.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from typing import Generic, TypeVar

import anyio
from anyio.abc import TaskGroup, TaskStatus

__all__ = ["UidEntry", "UidRegistry"]

T = TypeVar("T")


@dataclass(eq=False)
class UidEntry(Generic[T]):
    """One uid's item, the uses of it in progress, when the last ended, and its start and retirement."""

    item: T
    uses: int = 0
    used_at: float = field(default_factory=time.monotonic)
    started: anyio.Event = field(default_factory=anyio.Event)
    retired: anyio.Event = field(default_factory=anyio.Event)


class UidRegistry(Generic[T]):
    """The item of each host uid in use lately; see the module docstring."""

    def __init__(
        self,
        make: Callable[[int], T],
        keep: Callable[[T], AbstractAsyncContextManager[object]],
        *,
        idle_for: float,
    ) -> None:
        """``idle_for``: seconds unused before an item is retired (0: never)."""
        self._make = make
        self._keep_item = keep
        self._idle_for = idle_for
        self._entries: dict[int, UidEntry[T]] = {}
        self._group: TaskGroup | None = None

    @property
    def running_now(self) -> bool:
        return self._group is not None

    def get(self, uid: int) -> T | None:
        """``uid``'s item, if it has one now."""
        entry = self._entries.get(uid)
        return None if entry is None else entry.item

    def items(self) -> list[T]:
        """Every uid's item now (a copy: the metrics read it from a worker thread)."""
        return [entry.item for entry in list(self._entries.values())]

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        """Keep the items made in this block; all are retired on the way out."""
        async with anyio.create_task_group() as group:
            if self._idle_for > 0:
                group.start_soon(self._retire_idle)
            self._group = group
            try:
                yield
            finally:
                self._group = None
                for entry in self._entries.values():
                    entry.retired.set()
                self._entries.clear()
                group.cancel_scope.cancel()

    @contextlib.asynccontextmanager
    async def use(self, uid: int) -> AsyncIterator[UidEntry[T] | None]:
        """``uid``'s entry for one use (made, and its keeping started, on the first); None: not running."""
        if self._group is None:
            yield None
            return
        entry = self._entries.get(uid)
        if entry is None:
            entry = self._entries[uid] = UidEntry(self._make(uid))
            self._group.start_soon(self._keep, entry)
        entry.uses += 1
        try:
            yield entry
        finally:
            entry.uses -= 1
            entry.used_at = time.monotonic()

    async def _keep(self, entry: UidEntry[T], *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Keep ``entry``'s item until it is retired (or the registry stops)."""
        async with self._keep_item(entry.item):
            entry.started.set()
            task_status.started()
            await entry.retired.wait()

    async def _retire_idle(self) -> None:
        """Retire each uid's item no use has touched for ``idle_for``."""
        while True:
            await anyio.sleep(min(self._idle_for / 2, 60.0))
            now = time.monotonic()
            for uid, entry in list(self._entries.items()):
                if entry.uses == 0 and now - entry.used_at >= self._idle_for:
                    del self._entries[uid]  # the uid's next use makes a new one
                    entry.retired.set()
