"""Stateful sessions: one live interpreter per session key, kept between runs (their runs: :mod:`.session_runs`).

A session is a long-lived sandbox (the same policy as a fresh run's: limits, seccomp, its
workspace) whose runner keeps its ``__main__`` namespace and event loop between runs. A run is
judged by the exit code its DONE frame reports; if the interpreter dies, the session's state is
gone and the next run starts a new one. Where some tenant may be granted network, a session's
sandbox holds a relay and an (empty) directory for the egress proxy's socket for life; the socket
exists only during its runs granted network, and only those runs get the proxy variables.
"""

from __future__ import annotations

import collections
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import anyio
from anyio.abc import TaskGroup, TaskStatus

from mcp_sandbox.config import Settings
from mcp_sandbox.engine.interpreter import Interpreter
from mcp_sandbox.engine.opening import Opener
from mcp_sandbox.engine.ready import ReadySandbox
from mcp_sandbox.engine.ready_uids import ReadyByUid
from mcp_sandbox.engine.tools_view import ToolsView
from mcp_sandbox.errors import BusyError
from mcp_sandbox.workspace.changes import ChangeGate

__all__ = ["Lease", "SessionManager"]

# How long closing a session (kill, then remove its scratch files) may hold up whoever waits for it.
_CLOSE_SECONDS = 10.0
_REAP_MAX_INTERVAL = 5.0


@dataclass(eq=False)
class _Live:
    """One interpreter of a session, from start to close."""

    interpreter: Interpreter
    tools: ToolsView
    sockets: Path | None  # the directory for the egress proxy's socket (None: it holds no relay)
    workspace: Path | None  # as requested (None: a scratch workspace of its own)
    stop: anyio.Event = field(default_factory=anyio.Event)  # ask the owner task to close it
    closed: anyio.Event = field(default_factory=anyio.Event)  # the owner task has closed it
    ended: str | None = None  # why the host stopped it while a run may have been using it


@dataclass(eq=False)
class _Session:
    key: str
    last_used: float
    tenant: str = "default"
    lock: anyio.Lock = field(default_factory=anyio.Lock)
    users: int = 0  # runs holding or waiting for the lock
    live: _Live | None = None


@dataclass(eq=False)
class Lease:
    """One run's hold on its session, for the duration of the run."""

    interpreter: Interpreter
    tools: ToolsView
    new: bool  # this run starts a fresh interpreter
    _live: _Live
    born: bool = False  # that interpreter is a session-ready sandbox's (see .ready)

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


class SessionManager:
    """Live sessions by key.

    - one run at a time per session: a second run waits for the first (within its own timeout);
    - at most ``tenant_sessions`` live per tenant: a tenant's new one evicts that tenant's least
      recently used idle one (never another tenant's), and when all of its own are busy the run is
      refused with :class:`~mcp_sandbox.errors.BusyError`;
    - at most ``max_sessions`` live in all: a new one evicts the least recently used idle session of
      the tenant holding the most, and when every one is busy the run is refused the same way;
    - a session idle for ``session_ttl`` is stopped by a reaper task (its files stay);
    - a session ends early when its interpreter dies or a run times out; the next run starts a new one.

    Every interpreter has one owner task in the manager's task group (see :meth:`running`): it
    starts the sandbox, keeps it until told to stop or until it dies, then closes it.
    """

    def __init__(self, settings: Settings, opener: Opener, ready: ReadyByUid, gate: ChangeGate | None = None) -> None:
        """``gate``: the conversations' change locks, held while a born session adopts one (:mod:`.ready`)."""
        self._settings = settings
        self._opener = opener
        self._ready = ready
        self._gate = ChangeGate() if gate is None else gate
        self._sessions: dict[str, _Session] = {}
        self._group: TaskGroup | None = None

    def live(self) -> set[str]:
        """Keys of the sessions that exist (an interpreter running, starting or awaited)."""
        return set(self._sessions)

    def busy(self) -> set[str]:
        """Keys of the sessions with a run in progress or waiting."""
        return {key for key, session in self._sessions.items() if session.users > 0}

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        """Own the sessions: a task group with the reaper and every interpreter's owner task.

        On the way out every session is closed (bounded, shielded from cancellation).

        Raises:
            RuntimeError: already running.
        """
        if self._group is not None:
            raise RuntimeError("the session manager is already running")
        failure: Exception | None = None
        async with anyio.create_task_group() as group:
            self._group = group
            group.start_soon(self._reap)
            try:
                yield
            except Exception as exc:  # raised below, not wrapped in the task group's ExceptionGroup
                failure = exc
            finally:
                self._group = None
                with anyio.CancelScope(shield=True), anyio.move_on_after(_CLOSE_SECONDS):
                    await self._close_all("the server is shutting down")
                group.cancel_scope.cancel()
        if failure is not None:
            raise failure

    @contextlib.asynccontextmanager
    async def lease(
        self,
        key: str,
        *,
        workspace: Path | None,
        reset: bool,
        tenant: str = "default",
        born: bool = False,
        preloaded: bool = True,
    ) -> AsyncIterator[Lease]:
        """Hold session ``key`` for one run: wait for its previous run, start its interpreter if needed.

        The interpreter is restarted when ``reset`` is set, when it died, or when ``workspace``
        differs from the one it was started with. The caller bounds the wait (its deadline).
        With ``born``, a new interpreter is a session-ready sandbox's of the tenant's uid where one is
        idle (a preloading one if ``preloaded``, see :meth:`.ReadyPool.claim`).

        Raises:
            RuntimeError: the manager is not running (see :meth:`running`).
            BusyError: the session is new and every live session (of the tenant, or in all) is busy.
            SandboxStartError: the interpreter could not be started.
        """
        session = await self._acquire(key, tenant)
        ready: ReadySandbox | None = None
        try:
            live = session.live
            if live is not None and (reset or live.workspace != workspace or live.interpreter.exited.is_set()):
                await self._retire(live)
                live = None
            new = live is None
            if live is None:
                group = self._require_group()
                if born and workspace is not None:
                    ready = await self._ready.claim(workspace, tenant, self._gate.lock(key), preloaded=preloaded)
                live = await group.start(self._own, session, workspace, ready)
            yield Lease(live.interpreter, live.tools, new, live, born=ready is not None)
        finally:
            if ready is not None:  # its replacement starts after this first run, not beside it
                self._ready.settle(ready)
            session.last_used = anyio.current_time()
            session.users -= 1
            session.lock.release()
            self._forget_if_unused(session)

    @contextlib.asynccontextmanager
    async def holding(self, key: str) -> AsyncIterator[Interpreter | None]:
        """Hold session ``key`` between two runs (its running one waited for; the caller bounds the
        wait): its live interpreter, or None. Starts and evicts nothing (a fork's source, copied)."""
        session = self._sessions.get(key)
        if session is None:
            yield None
            return
        session.users += 1
        try:
            async with session.lock:
                live = session.live if self._sessions.get(key) is session else None
                alive = live is not None and not live.interpreter.exited.is_set()
                yield live.interpreter if alive and live is not None else None
        finally:
            session.last_used = anyio.current_time()
            session.users -= 1
            self._forget_if_unused(session)

    async def end(self, key: str, reason: str = "the session was ended") -> bool:
        """Stop session ``key`` now, even mid-run (that run fails saying ``reason``); False if there was none."""
        session = self._sessions.pop(key, None)
        if session is None:
            return False
        live = session.live
        if live is not None:
            live.ended = reason
            await live.interpreter.kill()
            with anyio.CancelScope(shield=True), anyio.move_on_after(_CLOSE_SECONDS):
                await self._retire(live)
        return True

    # --- internals --------------------------------------------------------------------------

    def _require_group(self) -> TaskGroup:
        if self._group is None:
            raise RuntimeError("sessions need a running engine: use `async with engine.running():`")
        return self._group

    async def _acquire(self, key: str, tenant: str) -> _Session:
        """The session ``key`` (created if needed) with its lock held and this run counted as a user."""
        self._require_group()
        while True:
            session = self._sessions.get(key)
            if session is None:
                await self._make_room(tenant)
                session = self._sessions.get(key)  # another run may have created it meanwhile
                if session is None:
                    session = _Session(key, anyio.current_time(), tenant)
                    self._sessions[key] = session
            session.users += 1
            try:
                await session.lock.acquire()
            except BaseException:
                session.users -= 1
                self._forget_if_unused(session)
                raise
            if self._sessions.get(key) is session:
                return session
            # Ended (end_session) while this run waited: start over with a new session.
            session.users -= 1
            session.lock.release()

    async def _make_room(self, tenant: str) -> None:
        """Evict least recently used idle sessions until a new one of ``tenant`` fits.

        Over the tenant's own cap only its own sessions are evicted; over the server's, those
        of the tenant holding the most.

        Raises:
            BusyError: every session that could make room is busy.
        """
        limit = self._settings.sessions.max_sessions
        tenant_limit = self._settings.sessions.tenant_sessions or limit  # None: only the server's cap
        while True:
            sessions = list(self._sessions.values())
            own = [session for session in sessions if session.tenant == tenant]
            if len(own) >= tenant_limit:
                idle = [session for session in own if session.users == 0]
                if not idle:
                    raise BusyError(
                        f"all {tenant_limit} sessions of this tenant are busy; try again when one of its runs is done"
                    )
            elif len(sessions) >= limit:
                idle = [session for session in sessions if session.users == 0]
                if not idle:
                    raise BusyError(f"all {limit} sessions are busy; try again when a run has finished")
            else:
                return
            held = collections.Counter(session.tenant for session in sessions)
            victim = min(idle, key=lambda session: (-held[session.tenant], session.last_used))
            del self._sessions[victim.key]
            if victim.live is not None:
                with anyio.CancelScope(shield=True), anyio.move_on_after(_CLOSE_SECONDS):
                    await self._retire(victim.live)

    def _forget_if_unused(self, session: _Session) -> None:
        if session.users == 0 and session.live is None and self._sessions.get(session.key) is session:
            del self._sessions[session.key]

    async def _retire(self, live: _Live) -> None:
        """Have the owner task close ``live``, and wait until it has (the caller bounds the wait)."""
        live.stop.set()
        await live.closed.wait()

    async def _own(
        self, session: _Session, workspace: Path | None, ready: ReadySandbox | None, *, task_status: TaskStatus[_Live]
    ) -> None:
        """The owner task of one interpreter of ``session`` (``ready``'s, or a new one): keep it, then close it."""
        live: _Live | None = None
        try:
            opened = self._opener.session(workspace, session.tenant) if ready is None else ready.held()
            async with opened as (runner, tools, sockets):
                live = _Live(runner, tools, sockets, workspace)
                session.live = live
                task_status.started(live)
                async with anyio.create_task_group() as watch:
                    watch.start_soon(_stop_on_exit, live)
                    await live.stop.wait()
                    watch.cancel_scope.cancel()
        finally:
            if live is not None:
                if session.live is live:
                    session.live = None
                live.closed.set()
                self._forget_if_unused(session)

    async def _reap(self) -> None:
        """Stop sessions idle for ``session_ttl``."""
        ttl = self._settings.sessions.session_ttl
        interval = max(0.01, min(ttl / 4, _REAP_MAX_INTERVAL))
        while True:
            await anyio.sleep(interval)
            now = anyio.current_time()
            for session in list(self._sessions.values()):
                if session.users == 0 and now - session.last_used >= ttl:
                    del self._sessions[session.key]
                    if session.live is not None:
                        session.live.stop.set()  # its owner closes it; nothing waits here

    async def _close_all(self, reason: str) -> None:
        sessions, self._sessions = list(self._sessions.values()), {}
        lives = [session.live for session in sessions if session.live is not None]
        for live in lives:
            live.ended = reason
            live.stop.set()
        for live in lives:
            await live.closed.wait()


async def _stop_on_exit(live: _Live) -> None:
    await live.interpreter.exited.wait()
    live.stop.set()
