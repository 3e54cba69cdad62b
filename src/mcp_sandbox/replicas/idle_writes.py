"""Write-back of conversations between calls: what a session's background processes write after
its run answered reaches the object store while the session is idle and once it has ended.

Each run's call writes back before it answers; this covers the rest. A conversation becomes
*pending* when one of its runs finishes, stays pending while its session is live, and leaves once
a write-back after its session ended succeeded (or its lease went to another replica: the files
are that replica's now). :meth:`IdleWrites.run` writes back every pending conversation with no
call in flight every ``write_back_interval``; :meth:`IdleWrites.flush` does it once more, bounded,
when the server drains or stops. A store that is down is logged and retried on the next pass.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Collection

import anyio

from mcp_sandbox.events import Event, RunFinished

__all__ = ["IdleWrites", "flushed"]

logger = logging.getLogger(__name__)

FLUSH_SECONDS = 30.0  # the most a drain or a shutdown waits for the last write-backs


class IdleWrites:
    """The conversations whose files may have changed since their last write-back."""

    def __init__(
        self,
        write_back: Callable[[str], Awaitable[Collection[str]]],
        live: Callable[[], Collection[str]],
        busy: Callable[[], Collection[str]],
        holds: Callable[[str], bool] | None,
        interval: float,
        pending: set[str],
    ) -> None:
        """``live``: conversations with a session; ``busy``: with a call in flight (it writes back
        itself); ``holds``: whether this replica holds a conversation's lease (None: one server);
        ``pending``: the set kept of the conversations to write back (shared: they are busy)."""
        self._write_back = write_back
        self._live = live
        self._busy = busy
        self._holds = holds
        self._interval = interval
        self.pending = pending

    def observe(self, event: Event) -> None:
        """An observer of the event hub: a conversation's finished run makes it pending."""
        if isinstance(event, RunFinished) and event.conversation is not None:
            self.pending.add(event.conversation)

    async def run(self) -> None:
        """Write back the pending conversations every ``interval``, until cancelled."""
        while True:
            await anyio.sleep(self._interval)
            await self.once()

    async def flush(self) -> None:
        """One pass, bounded by :data:`FLUSH_SECONDS` and shielded (a drain, a shutdown)."""
        with anyio.move_on_after(FLUSH_SECONDS, shield=True) as scope:
            await self.once()
        if scope.cancelled_caught:
            logger.warning("%d conversations not written back to the object store in time", len(self.pending))

    async def once(self) -> None:
        """Write back each pending conversation that has no call in flight."""
        live = set(self._live())
        self.pending |= live
        busy = set(self._busy())
        for key in sorted(self.pending - busy):
            if self._holds is not None and not self._holds(key):
                self.pending.discard(key)  # another replica's now, or given back after its last write-back
                continue
            try:
                unsaved = await self._write_back(key)
            except Exception as exc:  # a store that is down must not stop the server: retried next pass
                logger.warning("conversation %s…: idle write-back to the object store failed: %s", key[:8], exc)
                continue
            if unsaved:  # files the store did not take: still pending, their lease kept, retried next pass
                logger.warning("conversation %s…: %d files not written back to the object store", key[:8], len(unsaved))
                continue
            if key not in live:
                self.pending.discard(key)


async def flushed(idle: IdleWrites | None, then: Awaitable[None]) -> None:
    """The last idle write-backs (with an object store), then ``then`` (leases given back)."""
    if idle is not None:
        await idle.flush()
    await then
