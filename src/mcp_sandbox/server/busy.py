"""Which conversations are busy here: a live session, a call in flight, or files not yet written back.

The one answer for everything that must leave a busy conversation alone: the replicas' leases
(a busy conversation's lease is renewed, not given back, and kept by a drain while a call is in
flight), the idle write-backs (a call in flight writes back itself) and retention (a busy
conversation is not deleted). A call is in flight from the claim of its lease
(:meth:`Busy.claiming`, the router's ``calling``) and while it works (:meth:`Busy.using`); the
engine says which have a session; the idle write-backs keep the set of those whose files the
object store has not taken yet in :attr:`Busy.unsaved`.

The leases once counted their claims apart: a drain then kept only the leases of calls past
their claim, and gave back one whose call still waited for its restore.
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
        self._calls: collections.Counter[str] = collections.Counter()  # working on the conversation
        self._claims: collections.Counter[str] = collections.Counter()  # holding its lease, from the claim
        self.unsaved: set[str] = set()  # written back between calls (IdleWrites' pending)

    def using(self, key: str | None) -> contextlib.AbstractContextManager[None]:
        """Mark a conversation busy for the block: a call working on it (None: no conversation)."""
        return _counted(self._calls, key)

    def claiming(self, key: str) -> contextlib.AbstractContextManager[None]:
        """Mark a conversation busy for the block: a call that claims its lease, waits for its
        restore and then does its work (or forwards it); its lease is kept meanwhile."""
        return _counted(self._claims, key)

    def calls(self, key: str) -> int:
        """How many calls are working on conversation ``key`` here (:meth:`using`)."""
        return self._calls[key]

    def in_flight(self) -> set[str]:
        """The conversations with a call in flight: claiming their lease or working on them."""
        return set(self._calls) | set(self._claims)

    def now(self) -> set[str]:
        """Every busy conversation (call it on the event loop, which owns the sessions and the counts)."""
        return set(self._live()) | self.in_flight() | self.unsaved

    def from_thread(self, also: Collection[str] = ()) -> Collection[str]:
        """:meth:`now` and ``also``, read live from a worker thread (retention checks each
        conversation just before deleting it)."""
        return _ReadFromThread(self, frozenset(also))


@contextlib.contextmanager
def _counted(counter: collections.Counter[str], key: str | None) -> Iterator[None]:
    if key is None:
        yield
        return
    counter[key] += 1
    try:
        yield
    finally:
        counter[key] -= 1
        if not counter[key]:
            del counter[key]


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
