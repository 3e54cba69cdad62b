"""Stateful sessions: one live interpreter per session key, kept between runs (their runs: :mod:`.session_runs`).

A session is a long-lived sandbox (the same policy as a fresh run's: limits, seccomp, its
workspace) whose runner keeps its ``__main__`` namespace and event loop between runs. A run is
judged by the exit code its DONE frame reports; if the interpreter dies, the session's state is
gone and the next run starts a new one. Where some tenant may be granted network, a session's
sandbox holds a relay and an (empty) directory for the egress proxy's socket for life; the socket
exists only during its runs granted network, and only those runs get the proxy variables.

A session idle for ``session_park_after`` (and each one at a graceful stop) is parked where the
manager runs with :class:`~.parking.ParkedStates` (the idle policy: :mod:`.idle_policy`): its
variables saved beside its conversation, its sandbox released; the run that next leases it gets the
state to load first (``Lease.parked``).
"""

from __future__ import annotations

import collections
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import anyio
import anyio.to_thread
from anyio.abc import TaskGroup, TaskStatus

from mcp_sandbox.config import EngineSettings
from mcp_sandbox.engine.fork_state import ForkState
from mcp_sandbox.engine.idle_policy import IdlePolicy
from mcp_sandbox.engine.interpreter import Interpreter
from mcp_sandbox.engine.opener import Opener
from mcp_sandbox.engine.parking import ParkedStates
from mcp_sandbox.engine.ready import ReadySandbox
from mcp_sandbox.engine.ready_by_uid import ReadyByUid
from mcp_sandbox.engine.session_state import Lease, Live, Session, forget_if_unused
from mcp_sandbox.errors import BusyError
from mcp_sandbox.workspace.changes import ChangeGate

__all__ = ["Lease", "SessionManager"]


# How long closing a session (kill, then remove its scratch files) may hold up whoever waits for it.
_CLOSE_SECONDS = 10.0


class SessionManager:
    """Live sessions by key.

    - one run at a time per session: a second run waits for the first (within its own timeout);
    - at most ``tenant_sessions`` live per tenant: a tenant's new one evicts that tenant's least
      recently used idle one (never another tenant's), and when all of its own are busy the run is
      refused with :class:`~mcp_sandbox.errors.BusyError`;
    - at most ``max_sessions`` live in all: a new one evicts the least recently used idle session of
      the tenant holding the most, and when every one is busy the run is refused the same way;
    - with parking, an evicted session is parked first (its next run resumes it), as at idle;
    - a session idle for ``session_ttl`` is stopped by a reaper task (its files stay);
    - a session ends early when its interpreter dies or a run times out; the next run starts a new one.

    Every interpreter has one owner task in the manager's task group (see :meth:`running`): it
    starts the sandbox, keeps it until told to stop or until it dies, then closes it.
    """

    def __init__(
        self, settings: EngineSettings, opener: Opener, ready: ReadyByUid, gate: ChangeGate | None = None
    ) -> None:
        """``gate``: the conversations' change locks, held while a born session adopts one (:mod:`.ready`)."""
        self._settings = settings
        self._opener = opener
        self._ready = ready
        self._gate = ChangeGate() if gate is None else gate
        self._sessions: dict[str, Session] = {}
        self._group: TaskGroup | None = None
        self._idle = IdlePolicy(settings.sessions, settings.workspaces, self._sessions)

    @property
    def _parked(self) -> ParkedStates | None:
        return self._idle.parked

    def live(self) -> set[str]:
        """Keys of the sessions that exist (an interpreter running, starting or awaited)."""
        return set(self._sessions)

    def busy(self) -> set[str]:
        """Keys of the sessions with a run in progress or waiting."""
        return {key for key, session in self._sessions.items() if session.users > 0}

    @contextlib.asynccontextmanager
    async def running(self, parked: ParkedStates | None = None) -> AsyncIterator[None]:
        """Own the sessions: a task group with the reaper and every interpreter's owner task.

        ``parked``: where idle sessions are parked and resumed from (None: never parked). On the
        way out every idle session is parked, then every session is closed (bounded, shielded
        from cancellation). Raises RuntimeError if already running.
        """
        if self._group is not None:
            raise RuntimeError("the session manager is already running")
        failure: Exception | None = None
        async with anyio.create_task_group() as group:
            self._group, self._idle.parked = group, parked
            if parked is not None:  # what sessions of an earlier server held
                await anyio.to_thread.run_sync(parked.sweep)
            group.start_soon(self._idle.reap, group)
            try:
                yield
            except Exception as exc:  # raised below, not wrapped in the task group's ExceptionGroup
                failure = exc
            finally:
                self._group = None
                await self.park_idle()
                self._idle.parked = None
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
        idle (a preloading one if ``preloaded``, see :meth:`.ReadyPool.claim`). A new interpreter of
        a conversation with a parked state gets it (``Lease.parked``; a preloading sandbox; its seal
        checked during the run, see :meth:`.ParkedStates.resume`), unless ``reset``, which deletes it.

        Raises:
            RuntimeError: the manager is not running (see :meth:`running`).
            BusyError: the session is new and every live session (of the tenant, or in all) is busy.
            SandboxStartError: the interpreter could not be started.
            WorkspaceError: the conversation's parked state has no seal (deleted; nothing was
                started), or cannot be read.
        """
        session = await self._acquire(key, tenant)
        ready: ReadySandbox | None = None
        parked: ForkState | None = None
        try:
            live = session.live
            if live is not None and (reset or live.workspace != workspace or live.interpreter.exited.is_set()):
                await self._retire(live)
                live = None
            new = live is None
            if live is None:
                group = self._require_group()
                if self._parked is not None and workspace is not None:
                    if reset:
                        await anyio.to_thread.run_sync(self._parked.discard, key)
                    else:
                        parked = await self._parked.resume(key, tenant)
                if born and workspace is not None:
                    preloaded = preloaded or parked is not None
                    ready = await self._ready.claim(workspace, tenant, self._gate.lock(key), preloaded=preloaded)
                live = await group.start(self._own, session, workspace, ready)
            yield Lease(live.interpreter, live.tools, new, live, born=ready is not None, parked=parked)
        finally:
            if parked is not None:
                parked.close()
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
                yield live.interpreter if live is not None and not live.interpreter.exited.is_set() else None
        finally:
            session.last_used = anyio.current_time()
            session.users -= 1
            self._forget_if_unused(session)

    async def parked_state(self, key: str, tenant: str) -> ForkState | None:
        """``key``'s parked state, checked, for a fork to carry (the caller closes it); None if it has none
        (raises :class:`~mcp_sandbox.errors.WorkspaceError` if it failed its check (deleted) or cannot be read)."""
        return None if self._parked is None else await self._parked.open(key, tenant)

    async def unpark(self, key: str) -> None:
        """``key``'s resumed session loaded its parked state: held until it is closed (:meth:`.ParkedStates.hold`)."""
        session = self._sessions.get(key)
        if self._parked is not None and session is not None and session.live is not None:
            await anyio.to_thread.run_sync(self._parked.hold, key)
            session.live.held = self._parked

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

    async def _acquire(self, key: str, tenant: str) -> Session:
        """The session ``key`` (created if needed) with its lock held and this run counted as a user."""
        self._require_group()
        while True:
            session = self._sessions.get(key)
            if session is None:
                await self._make_room(tenant)
                session = self._sessions.get(key)  # another run may have created it meanwhile
                if session is None:
                    session = Session(key, anyio.current_time(), tenant)
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
            if self._idle.parks(victim):
                # Parked, not lost: the new run waits for the room anyway (a victim that cannot be parked is stopped).
                await self._idle.park(victim, counted=False)
                if self._sessions.get(victim.key) is not victim:
                    continue
            del self._sessions[victim.key]
            if victim.live is not None:
                with anyio.CancelScope(shield=True), anyio.move_on_after(_CLOSE_SECONDS):
                    await self._retire(victim.live)

    def _forget_if_unused(self, session: Session) -> None:
        forget_if_unused(self._sessions, session)

    async def _retire(self, live: Live) -> None:
        """Have the owner task close ``live``, and wait until it has (the caller bounds the wait)."""
        live.stop.set()
        await live.closed.wait()

    async def _own(
        self, session: Session, workspace: Path | None, ready: ReadySandbox | None, *, task_status: TaskStatus[Live]
    ) -> None:
        """The owner task of one interpreter of ``session`` (``ready``'s, or a new one): keep it, then close it."""
        live: Live | None = None
        try:
            opened = self._opener.session(workspace, session.tenant) if ready is None else ready.held()
            async with opened as (runner, tools, sockets):
                live = Live(runner, tools, sockets, workspace)
                session.live = live
                task_status.started(live)
                async with anyio.create_task_group() as watch:
                    watch.start_soon(_stop_on_exit, live)
                    await live.stop.wait()
                    watch.cancel_scope.cancel()
        finally:
            if live is not None:
                if live.held is not None:  # its sandbox is gone, and its mapping with it
                    await live.held.release(session.key)
                if session.live is live:
                    session.live = None
                live.closed.set()
                self._forget_if_unused(session)

    async def park_idle(self) -> None:
        """Park every idle session now (:meth:`.IdlePolicy.park_idle`: bounded, shielded from
        cancellation); nothing with ``session_park_after`` 0 or without parking."""
        await self._idle.park_idle()

    async def _close_all(self, reason: str) -> None:
        sessions = list(self._sessions.values())
        self._sessions.clear()
        lives = [session.live for session in sessions if session.live is not None]
        for live in lives:
            live.ended = reason
            live.stop.set()
        for live in lives:
            await live.closed.wait()


async def _stop_on_exit(live: Live) -> None:
    await live.interpreter.exited.wait()
    live.stop.set()
