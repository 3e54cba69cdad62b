"""Which conversations are busy here: a live session, a call in flight, or files not yet written back.

The one answer for everything that must leave a busy conversation alone: the replicas' leases
(a busy conversation's lease is renewed, not given back) and retention (a busy conversation is
not deleted). Calls mark their conversation with :meth:`Busy.using`; the engine says which have a
session; the idle write-backs (:mod:`mcp_sandbox.replicas.idle_writes`) keep the set of those
whose files the object store has not taken yet in :attr:`Busy.unsaved`.
"""

from __future__ import annotations

import collections
import contextlib
from collections.abc import Callable, Collection, Iterator

import anyio.from_thread

__all__ = ["Busy"]


class Busy:
    """The conversations busy here. ``live()``: those with a session (the engine's)."""

    def __init__(self, live: Callable[[], Collection[str]]) -> None:
        self._live = live
        self._calls: collections.Counter[str] = collections.Counter()
        self.unsaved: set[str] = set()  # written back between calls (IdleWrites' pending)

    @contextlib.contextmanager
    def using(self, key: str | None) -> Iterator[None]:
        """Mark a conversation busy for the block (a call in flight)."""
        if key is None:
            yield
            return
        self._calls[key] += 1
        try:
            yield
        finally:
            self._calls[key] -= 1
            if not self._calls[key]:
                del self._calls[key]

    def calls(self, key: str) -> int:
        """How many calls of conversation ``key`` are in flight."""
        return self._calls[key]

    def in_flight(self) -> set[str]:
        """The conversations with a call in flight."""
        return set(self._calls)

    def now(self) -> set[str]:
        """Every busy conversation (call it on the event loop, which owns the sessions and the counts)."""
        return set(self._live()) | set(self._calls) | self.unsaved

    def from_thread(self, also: Collection[str] = ()) -> Collection[str]:
        """:meth:`now` and ``also``, read live from a worker thread (retention checks each
        conversation just before deleting it)."""
        return _ReadFromThread(self, frozenset(also))


class _ReadFromThread(Collection[str]):
    def __init__(self, busy: Busy, also: frozenset[str]) -> None:
        self._busy = busy
        self._also = also

    def _keys(self) -> set[str]:
        return anyio.from_thread.run_sync(self._busy.now) | self._also

    def __contains__(self, key: object) -> bool:
        return key in self._keys()

    def __iter__(self) -> Iterator[str]:
        return iter(self._keys())

    def __len__(self) -> int:
        return len(self._keys())
