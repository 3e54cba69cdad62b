"""The one way in for changes to a conversation's directory: its change lock, and the disk changes reserve.

Everything that changes what a conversation's directory *is* or adds files to it from the host
goes through :class:`ChangeGate`: an upload's commit (its rename into place, :mod:`.reservations`),
a born session's adoption of the directory by a session-ready sandbox (``engine.ready.adopt``),
a fork's copy (both the source, held still, and the new one), a replica's restore of it from the
object store (an earlier runner's files imported into it are uploads, each gated as one). Each holds the
conversation's lock for the step; structural steps (adoption, a fork's copy) for their whole
length, so an upload can never land half-way through one: an upload that recreated a folder
adoption had just moved out made its final rename fail, and the failed rollback split the
conversation between its directory and a sandbox's slot (issue 43). Runs are not gated: the code
writes from inside its sandbox, and an upload's commit holds the lock only for its rename, so
uploads during a long run go on as before.

Copies that add a conversation's worth of bytes at once (a fork) first *reserve* them against
the tenant's ``tenant_workspaces_bytes`` and the server's ``max_workspaces_bytes`` (with what the
other copies in progress reserved), and give them back when done or refused: concurrent forks
cannot pass a budget together, and a refused one has written nothing.
"""

from __future__ import annotations

import collections
import contextlib
import threading
from collections.abc import Callable, Iterator
from typing import TypeVar

from mcp_sandbox.errors import QuotaExceededError

__all__ = ["ChangeGate", "CopyReservation"]

T = TypeVar("T")


class ChangeGate:
    """Per-conversation change locks and the bytes copies in progress reserved. Thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._locks: dict[str, threading.Lock] = {}
        self._reserved: collections.Counter[str] = collections.Counter()  # per tenant

    def lock(self, key: str) -> threading.Lock:
        """The lock every change of conversation ``key`` holds (not reentrant)."""
        with self._lock:
            return self._locks.setdefault(key, threading.Lock())

    @contextlib.contextmanager
    def changing(self, *keys: str) -> Iterator[None]:
        """Hold the change locks of ``keys`` for the block (always taken in one order: no deadlock)."""
        with contextlib.ExitStack() as held:
            for key in sorted(set(keys)):
                held.enter_context(self.lock(key))
            yield

    def run(self, key: str, change: Callable[..., T], *args: object) -> T:
        """``change(*args)`` under conversation ``key``'s change lock (for a worker thread: it blocks)."""
        with self.lock(key):
            return change(*args)

    @contextlib.contextmanager
    def reserving(
        self, tenant: str, size: int, held: tuple[int, int], budgets: tuple[int | None, int]
    ) -> Iterator[CopyReservation]:
        """Reserve ``size`` bytes of disk for a copy of ``tenant``'s for the block; given back after.

        ``held``: the bytes the tenant's and all conversations hold now; ``budgets``: the
        tenant's (None: no budget of its own) and the server's. The reservation yielded can grow
        (a fork's variables, spooled as they come), checked against the same budgets each time.

        Raises:
            QuotaExceededError: with the other copies in progress, a budget would be passed.
        """
        reservation = CopyReservation(self, tenant, held, budgets)
        reservation.grow(size)
        try:
            yield reservation
        finally:
            with self._lock:
                self._reserved[tenant] -= reservation.size
                if not self._reserved[tenant]:
                    del self._reserved[tenant]

    def _take(self, tenant: str, size: int, held: tuple[int, int], budgets: tuple[int | None, int]) -> None:
        tenant_held, all_held = held
        tenant_budget, server_budget = budgets
        with self._lock:
            mine = tenant_held + self._reserved[tenant] + size
            everyone = all_held + sum(self._reserved.values()) + size
            if tenant_budget is not None and mine > tenant_budget:
                raise QuotaExceededError(
                    "bytes",
                    mine - size,
                    tenant_budget,
                    f"the tenant's conversations would take {mine} bytes, past its budget of {tenant_budget} "
                    "(tenant_workspaces_bytes)",
                )
            if everyone > server_budget:
                raise QuotaExceededError(
                    "bytes",
                    everyone - size,
                    server_budget,
                    f"the server's conversations would take {everyone} bytes, past its budget of {server_budget} "
                    "(max_workspaces_bytes)",
                )
            self._reserved[tenant] += size


class CopyReservation:
    """Bytes reserved for one copy (see :meth:`ChangeGate.reserving`), which may grow while it lasts."""

    def __init__(self, gate: ChangeGate, tenant: str, held: tuple[int, int], budgets: tuple[int | None, int]) -> None:
        self._gate = gate
        self._tenant = tenant
        self._held = held
        self._budgets = budgets
        self.size = 0

    def grow(self, size: int) -> None:
        """Reserve ``size`` bytes more (thread-safe).

        Raises:
            QuotaExceededError: with the other copies in progress, a budget would be passed;
                nothing more was reserved.
        """
        self._gate._take(self._tenant, size, self._held, self._budgets)
        self.size += size
