"""Admission control: a bounded number of runs at once, a bounded queue, a bounded wait.

Past the limit a run waits its turn (first come, first served); when the queue is full, or
the wait would pass ``queue_timeout``, it is refused with :class:`~mcp_sandbox.errors.BusyError`
without running anything. Overload then shows as quick, clear refusals instead of every run
slowing down until all of them time out.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

import anyio

from mcp_sandbox.errors import BusyError

__all__ = ["Admission"]


class Admission:
    """At most ``limit`` holders of a slot at once; at most ``queue`` waiting, each at most ``wait`` seconds."""

    def __init__(self, limit: int, queue: int, wait: float) -> None:
        self.limit = limit
        self.queue = queue
        self.wait = wait
        self._slots = anyio.Semaphore(limit)

    @property
    def running(self) -> int:
        return self.limit - self._slots.value

    @property
    def waiting(self) -> int:
        return self._slots.statistics().tasks_waiting

    @contextlib.asynccontextmanager
    async def slot(self) -> AsyncIterator[None]:
        """Hold a slot for the block.

        Raises:
            BusyError: the queue is full, or no slot came free within ``wait`` seconds.
        """
        if self._slots.value == 0 and self.waiting >= self.queue:
            raise BusyError(
                f"{self.running} runs are running and {self.waiting} are waiting, the most this server "
                "accepts; try again shortly"
            )
        acquired = False
        with anyio.move_on_after(self.wait):
            await self._slots.acquire()
            acquired = True
        if not acquired:
            raise BusyError(
                f"no run slot came free within {self.wait:g} s ({self.running} runs are running); try again shortly"
            )
        try:
            yield
        finally:
            self._slots.release()
