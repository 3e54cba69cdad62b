"""What becomes of an idle session: parked after ``session_park_after``, stopped after ``session_ttl``.

The sessions themselves (leases, eviction, each interpreter's owner task) are :mod:`.sessions`';
this module holds the policy the manager applies to the ones nobody uses: a reaper loop that parks
(:class:`~.parking.ParkedStates`: its variables saved beside its conversation, its sandbox
released) or stops them, a park of one session (also for an evicted one), and the park of every
idle one at a graceful stop. A session that could not be parked stays live (``session_ttl`` stops
it) and is not tried again.
"""

from __future__ import annotations

import logging

import anyio
import anyio.to_thread
from anyio.abc import TaskGroup

from mcp_sandbox.config import SessionSettings, WorkspaceSettings
from mcp_sandbox.engine.parking import ParkedStates, park_budget
from mcp_sandbox.engine.session_state import Session, forget_if_unused

__all__ = ["IdlePolicy"]

logger = logging.getLogger(__name__)

_REAP_MAX_INTERVAL = 5.0
# How long one park may take (its snapshot, then its file written), and all of them at a graceful stop.
_PARK_SECONDS = 30.0
_PARK_ALL_SECONDS = 30.0


class IdlePolicy:
    """Parks or stops the idle sessions of one manager's ``table`` (shared with it).

    ``parked``: where idle sessions are parked, set by the manager while it runs with parking (None:
    never parked, only stopped at ``session_ttl``).
    """

    def __init__(self, sessions: SessionSettings, workspaces: WorkspaceSettings, table: dict[str, Session]) -> None:
        self._settings = sessions
        self._workspaces = workspaces
        self._table = table
        self.parked: ParkedStates | None = None

    def parks(self, session: Session) -> bool:
        """Whether ``session`` is parked, not stopped, when it must go (a live one, not failed to park before)."""
        live = session.live
        parking = self.parked is not None and self._settings.session_park_after > 0
        return parking and live is not None and live.workspace is not None and not session.unparked

    async def reap(self, group: TaskGroup) -> None:
        """Park sessions idle for ``session_park_after`` (each in a task of its own in ``group``); stop
        those idle for ``session_ttl``. Until cancelled."""
        ttl = self._settings.session_ttl
        park_after = min(self._settings.session_park_after or ttl, ttl)
        interval = max(0.01, min(min(ttl, park_after) / 4, _REAP_MAX_INTERVAL))
        while True:
            await anyio.sleep(interval)
            now = anyio.current_time()
            for session in list(self._table.values()):
                if session.users:
                    continue
                idle = now - session.last_used
                if idle >= park_after and self.parks(session):
                    session.users += 1  # until the park is done: nothing else takes it meanwhile
                    group.start_soon(self.park, session)
                elif idle >= ttl:
                    del self._table[session.key]
                    if session.live is not None:
                        session.live.stop.set()  # its owner closes it; nothing waits here

    async def park(self, session: Session, counted: bool = True) -> None:
        """Park ``session``'s interpreter (its lock held: no run meanwhile), then stop it; where it
        cannot be parked, it stays live (``session_ttl`` stops it). ``counted``: the caller counted
        this as a user of the session (as the reaper does before it starts this task)."""
        if not counted:
            session.users += 1
        try:
            async with session.lock:
                live, parked = session.live, self.parked
                if live is None or live.workspace is None or live.interpreter.exited.is_set() or parked is None:
                    return
                if self._table.get(session.key) is not session:
                    return
                why: str | None = "it took too long"
                with anyio.move_on_after(_PARK_SECONDS):
                    budget = await anyio.to_thread.run_sync(park_budget, self._workspaces, live.workspace)
                    why = await parked.park(session.key, session.tenant, live.interpreter, budget)
                if why is not None:
                    session.unparked = True
                    logger.warning("a session could not be parked, it stays live: %s", why)
                    return
                del self._table[session.key]
                live.stop.set()
        finally:
            session.users -= 1
            forget_if_unused(self._table, session)

    async def park_idle(self) -> None:
        """Park every idle session now, each beside the others (a graceful stop; a replica's drain,
        before it gives their leases back); bounded, shielded from cancellation. One that could not
        be parked before is not tried again. None with ``session_park_after`` 0 (states parked before
        are still resumed)."""
        if self.parked is None or not self._settings.session_park_after:
            return
        with anyio.CancelScope(shield=True), anyio.move_on_after(_PARK_ALL_SECONDS):
            async with anyio.create_task_group() as parking:
                for session in list(self._table.values()):
                    if session.users == 0 and session.live is not None and not session.unparked:
                        parking.start_soon(self.park, session, False)
