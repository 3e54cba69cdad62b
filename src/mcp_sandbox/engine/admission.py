"""Admission control: bounded runs at once, bounded queues, a bounded wait, fair between tenants.

At most ``limit`` runs execute at once, and at most ``tenant_limit`` of one tenant. Past that a
run waits its turn; the queue is served round robin between tenants (first come, first served
within one tenant), so a tenant that queues many runs delays its own, not the others'. When the
whole queue (``queue``) or the tenant's share of it (``tenant_queue``) is full, or the wait would
pass ``wait`` seconds, the run is refused with :class:`~mcp_sandbox.errors.BusyError` without
running anything. Overload then shows as quick, clear refusals instead of every run slowing down
until all of them time out. A full queue does not shut a tenant out: a tenant with nothing queued
takes the place of the newest waiter of the tenant with the most queued (two or more), which is
refused as a full queue's newcomer would have been. A traced run that waits gets a span for its wait
(``mcp_sandbox.admission``); one that finds a slot free gets none.
"""

from __future__ import annotations

import collections
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import anyio

from mcp_sandbox import tracing
from mcp_sandbox.errors import BusyError

__all__ = ["Admission"]


@dataclass(eq=False)
class _Waiter:
    tenant: str
    granted: bool = False
    refused: str | None = None  # why it was pushed out of the queue by another tenant's run
    event: anyio.Event = field(default_factory=anyio.Event)


class Admission:
    """Run slots: see the module docstring. Everything happens on the event loop (no locks needed)."""

    def __init__(
        self, limit: int, queue: int, wait: float, *, tenant_limit: int | None = None, tenant_queue: int | None = None
    ) -> None:
        self.limit = limit
        self.queue = queue
        self.wait = wait
        self.tenant_limit = limit if tenant_limit is None else min(limit, tenant_limit)
        self.tenant_queue = queue if tenant_queue is None else tenant_queue
        self._running: collections.Counter[str] = collections.Counter()
        self._queues: dict[str, collections.deque[_Waiter]] = {}
        self._turns: collections.deque[str] = collections.deque()  # tenants with waiters, next turn first

    @property
    def running(self) -> int:
        return sum(self._running.values())

    @property
    def waiting(self) -> int:
        return sum(len(queue) for queue in self._queues.values())

    def running_of(self, tenant: str) -> int:
        """Runs of ``tenant`` holding a slot now."""
        return self._running[tenant]

    def waiting_of(self, tenant: str) -> int:
        """Runs of ``tenant`` waiting for a slot now."""
        return len(self._queues.get(tenant, ()))

    @contextlib.asynccontextmanager
    async def slot(self, tenant: str = "default") -> AsyncIterator[None]:
        """Hold a slot for ``tenant`` for the block.

        Raises:
            BusyError: the queue (or the tenant's share of it) is full, or no slot came free
                within ``wait`` seconds.
        """
        waiter = self._enqueue(tenant)
        self._dispatch()
        if not waiter.granted:
            with tracing.span("mcp_sandbox.admission", {"mcp_sandbox.tenant": tenant}):
                await self._wait(waiter)
        try:
            yield
        finally:
            self._release(waiter)

    async def _wait(self, waiter: _Waiter) -> None:
        """Wait for ``waiter``'s turn, bounded by :attr:`wait`.

        Raises:
            BusyError: it was pushed out of the queue, or no slot came free in time.
        """
        try:
            with anyio.move_on_after(self.wait):
                await waiter.event.wait()
        except BaseException:  # cancelled while waiting (or just granted): give the turn back
            self._release(waiter) if waiter.granted else self._leave(waiter)
            raise
        if waiter.refused is not None:
            raise BusyError(waiter.refused)
        if not waiter.granted:
            self._leave(waiter)
            raise BusyError(
                f"no run slot came free within {self.wait:g} s ({self.running} runs are running, "
                f"{self._running[waiter.tenant]} of them this tenant's); try again shortly"
            )

    def _release(self, waiter: _Waiter) -> None:
        self._running[waiter.tenant] -= 1
        if not self._running[waiter.tenant]:
            del self._running[waiter.tenant]
        self._dispatch()

    def _enqueue(self, tenant: str) -> _Waiter:
        queued = self.waiting_of(tenant)
        can_start = self._running[tenant] < self.tenant_limit and self.running < self.limit and not self.waiting
        if not can_start:
            if queued >= self.tenant_queue:
                raise BusyError(
                    f"this tenant has {self._running[tenant]} runs running and {queued} waiting, the most "
                    "one tenant may have; try again when one has finished"
                )
            if self.waiting >= self.queue and not (queued == 0 and self._push_out_newest()):
                raise BusyError(self._full_message())
        waiter = _Waiter(tenant)
        queue = self._queues.get(tenant)
        if queue is None:
            queue = self._queues[tenant] = collections.deque()
            self._turns.append(tenant)
        queue.append(waiter)
        return waiter

    def _full_message(self) -> str:
        return (
            f"{self.running} runs are running and {self.waiting} are waiting, the most this server "
            "accepts; try again shortly"
        )

    def _push_out_newest(self) -> bool:
        """Refuse the newest waiter of the tenant with the most queued, if it has two or more.

        Two, not one: the tenant pushed out keeps a waiter, so tenants with one each never push
        each other out in turn.
        """
        if not self._queues:
            return False
        tenant = max(self._queues, key=lambda name: len(self._queues[name]))
        if len(self._queues[tenant]) < 2:
            return False
        message = self._full_message()
        victim = self._queues[tenant].pop()
        victim.refused = message
        victim.event.set()
        return True

    def _leave(self, waiter: _Waiter) -> None:
        queue = self._queues.get(waiter.tenant)
        if queue is not None and waiter in queue:
            queue.remove(waiter)
            if not queue:
                del self._queues[waiter.tenant]
                self._turns.remove(waiter.tenant)

    def _dispatch(self) -> None:
        """Grant free slots, one tenant at a time in turn, skipping tenants at their own limit."""
        skipped = 0
        while self._turns and self.running < self.limit and skipped < len(self._turns):
            tenant = self._turns.popleft()
            queue = self._queues[tenant]
            if self._running[tenant] >= self.tenant_limit:
                self._turns.append(tenant)
                skipped += 1
                continue
            skipped = 0
            waiter = queue.popleft()
            waiter.granted = True
            self._running[tenant] += 1
            waiter.event.set()
            if queue:
                self._turns.append(tenant)
            else:
                del self._queues[tenant]
