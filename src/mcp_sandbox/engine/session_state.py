"""A session's records: the interpreter it holds (:class:`Live`), its entry in the manager
(:class:`Session`), and one run's hold on it (:class:`Lease`); the manager is :mod:`.sessions`',
what becomes of an idle one :mod:`.idle_policy`'s.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import anyio

from mcp_sandbox.engine.fork_state import ForkState
from mcp_sandbox.engine.interpreter import Interpreter
from mcp_sandbox.engine.parking import ParkedStates
from mcp_sandbox.engine.tools_view import ToolsView

__all__ = ["Lease", "Live", "Session", "forget_if_unused"]


@dataclass(eq=False)
class Live:
    """One interpreter of a session, from start to close."""

    interpreter: Interpreter
    tools: ToolsView
    sockets: Path | None  # the directory for the egress proxy's socket (None: it holds no relay)
    workspace: Path | None  # as requested (None: a scratch workspace of its own)
    stop: anyio.Event = field(default_factory=anyio.Event)  # ask the owner task to close it
    closed: anyio.Event = field(default_factory=anyio.Event)  # the owner task has closed it
    ended: str | None = None  # why the host stopped it while a run may have been using it
    held: ParkedStates | None = None  # keeps the parked state it resumed (it may map it) until it is closed


@dataclass(eq=False)
class Session:
    """A conversation's entry in the manager: its lock, its users, its interpreter if live."""

    key: str
    last_used: float
    tenant: str = "default"
    lock: anyio.Lock = field(default_factory=anyio.Lock)
    users: int = 0  # runs holding or waiting for the lock
    live: Live | None = None
    unparked: bool = False  # parking its live interpreter failed once: it is stopped at session_ttl


def forget_if_unused(table: dict[str, Session], session: Session) -> None:
    """Drop ``session`` from ``table`` once nothing uses it and it holds no interpreter."""
    if session.users == 0 and session.live is None and table.get(session.key) is session:
        del table[session.key]


@dataclass(eq=False)
class Lease:
    """One run's hold on its session, for the duration of the run."""

    interpreter: Interpreter
    tools: ToolsView
    new: bool  # this run starts a fresh interpreter
    _live: Live
    born: bool = False  # that interpreter is a session-ready sandbox's (see .ready)
    parked: ForkState | None = None  # a resumed session's parked state, for this first run to load

    @property
    def sockets(self) -> Path | None:
        """The directory the sandbox's relay reaches the egress proxy's socket in; None without a relay."""
        return self._live.sockets

    @property
    def ended(self) -> str | None:
        """Why the session was ended from outside during the run (``end_session``, shutdown), or None."""
        return self._live.ended

    async def discard(self) -> None:
        """Kill the interpreter now (timeout, crash, broken protocol): the next run starts a new one."""
        await self.interpreter.kill()
        self._live.stop.set()
