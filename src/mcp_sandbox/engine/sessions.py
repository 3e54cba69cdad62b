"""Stateful sessions: one live interpreter per session key, kept between runs.

A session is a long-lived sandbox (the same policy as a fresh run's: limits, seccomp, its
workspace) whose runner keeps its ``__main__`` namespace and event loop between runs. The
:class:`SessionManager` keeps them by key:

- one run at a time per session: a second run waits for the first (within its own timeout);
- at most ``tenant_sessions`` live per tenant: a tenant's new one evicts that tenant's least
  recently used idle one (never another tenant's), and when all of its own are busy the run is
  refused with :class:`~mcp_sandbox.errors.BusyError`;
- at most ``max_sessions`` live in all: a new one evicts the least recently used idle session of
  the tenant holding the most, and when every one is busy the run is refused the same way;
- a session idle for ``session_ttl`` is stopped by a reaper task (its files stay);
- a session ends early when its interpreter dies or a run times out; the next run starts a new one.

Every interpreter has one owner task in the manager's task group (see :meth:`SessionManager.running`):
it starts the sandbox, keeps it until told to stop or until it dies, then closes it.

Code mode: a session's sandbox cannot get new bind mounts, so it binds the stub root
(``StateLayout.stubs``) at ``/.stubs`` and a per-session host directory at ``/tools``, in which
the host points ``/tools/<alias>`` at the stubs of the current run's servers before each run.
"""

from __future__ import annotations

import collections
import contextlib
import hashlib
import logging
import os
import shutil
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from pathlib import Path

import anyio
import anyio.to_thread
from anyio.abc import TaskGroup, TaskStatus

from mcp_sandbox.config import Settings
from mcp_sandbox.engine.interpreter import Interpreter
from mcp_sandbox.errors import BusyError
from mcp_sandbox.sandbox.policy import TOOLS_MOUNT, Mount
from mcp_sandbox.state import StateLayout

__all__ = ["STUBS_MOUNT", "Lease", "SessionManager", "ToolsView"]

logger = logging.getLogger(__name__)

STUBS_MOUNT = "/.stubs"
# How long closing a session (kill, then remove its scratch files) may hold up whoever waits for it.
_CLOSE_SECONDS = 10.0
_REAP_MAX_INTERVAL = 5.0


class ToolsView:
    """A session's ``/tools``: a host directory of symlinks to the stubs of the current run's servers.

    The directory is the server's own (0755, bound read-only). A stub tree under the stub root
    is reached through ``/.stubs``; one elsewhere is copied into the directory once.
    """

    def __init__(self, directory: Path, stub_root: Path) -> None:
        self.directory = directory
        self.stub_root = stub_root
        self.empty = True  # it shows no stubs (new, or its last bind had none): binding none is a no-op

    @classmethod
    def create(cls, layout: StateLayout) -> ToolsView:
        """A new, empty view in ``layout.runs`` (named after this server's pid, so a sweep finds it).

        Raises:
            OSError: it cannot be created (``runs/`` must exist).
        """
        stub_root = layout.prepare_stubs()
        return cls(layout.new_tools_view(), stub_root)

    def mounts(self) -> tuple[Mount, ...]:
        """What the session's sandbox binds: the stub root and this directory."""
        return (Mount(self.stub_root, STUBS_MOUNT), Mount(self.directory, TOOLS_MOUNT))

    def bind(self, mounts: Sequence[Mount]) -> None:
        """Make ``/tools/<alias>`` show each of ``mounts`` (targets ``/tools/<alias>``), and nothing else.

        Raises:
            ValueError: a mount's target is not a directory directly under ``/tools``.
            OSError: the directory cannot be written.
        """
        wanted: dict[str, str] = {}
        for mount in mounts:
            alias = mount.target.removeprefix(TOOLS_MOUNT + "/")
            if alias == mount.target or not alias or "/" in alias or alias.startswith("."):
                raise ValueError(f"a session can only show stubs under {TOOLS_MOUNT}/<alias>, not at {mount.target}")
            wanted[alias] = self._inside(mount.source)
        in_use = {target.removeprefix(TOOLS_MOUNT + "/") for target in wanted.values()}
        for entry in os.listdir(self.directory):
            if not entry.startswith(".") and entry not in wanted:
                os.unlink(self.directory / entry)
            elif entry.startswith(".copy-") and entry not in in_use:
                # A copy an earlier run wanted: gone before this run, which may be another
                # tenant's (a warm sandbox serves any), can see it.
                shutil.rmtree(self.directory / entry)
        for alias, target in wanted.items():
            link = self.directory / alias
            if os.path.islink(link) and os.readlink(link) == target:
                continue
            # A new symlink renamed over the old one: a run never sees /tools/<alias> missing.
            scratch = self.directory / f".{alias}-{uuid.uuid4().hex}"
            os.symlink(target, scratch)
            os.rename(scratch, link)
        self.empty = not wanted

    async def show(self, mounts: Sequence[Mount]) -> None:
        """:meth:`bind` in a worker thread, or nothing at all when there is nothing to change (a run without tools).

        Raises:
            ValueError: a mount's target is not a directory directly under ``/tools``.
            OSError: the directory cannot be written.
        """
        if mounts or not self.empty:
            await anyio.to_thread.run_sync(self.bind, mounts)

    def _inside(self, source: Path) -> str:
        """Where ``source`` is seen inside the session's sandbox."""
        resolved, root = source.resolve(), self.stub_root.resolve()
        if resolved.is_relative_to(root) and resolved != root:
            return f"{STUBS_MOUNT}/{resolved.relative_to(root)}"
        copy = self.directory / f".copy-{hashlib.sha256(str(resolved).encode()).hexdigest()[:16]}"
        if not copy.exists():
            shutil.copytree(resolved, copy, symlinks=True)
            for directory, _, files in os.walk(copy):
                os.chmod(directory, 0o755)
                for name in files:
                    os.chmod(os.path.join(directory, name), 0o644)
        return f"{TOOLS_MOUNT}/{copy.name}"


# Opens a session's sandbox for a workspace (None: a scratch one it owns); yields its interpreter
# and its /tools view.
SessionOpener = Callable[[Path | None], AbstractAsyncContextManager[tuple[Interpreter, ToolsView]]]


@dataclass(eq=False)
class _Live:
    """One interpreter of a session, from start to close."""

    interpreter: Interpreter
    tools: ToolsView
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

    @property
    def ended(self) -> str | None:
        """Why the session was ended from outside during the run (``end_session``, shutdown), or None."""
        return self._live.ended

    async def discard(self) -> None:
        """Kill the interpreter now (timeout, crash, broken protocol): the next run starts a new one."""
        await self.interpreter.kill()
        self._live.stop.set()


class SessionManager:
    """Live sessions by key; see the module docstring."""

    def __init__(self, settings: Settings, opener: SessionOpener) -> None:
        self._settings = settings
        self._open = opener
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
        self, key: str, *, workspace: Path | None, reset: bool, tenant: str = "default"
    ) -> AsyncIterator[Lease]:
        """Hold session ``key`` for one run: wait for its previous run, start its interpreter if needed.

        The interpreter is restarted when ``reset`` is set, when it died, or when ``workspace``
        differs from the one it was started with. The caller bounds the wait (its deadline).

        Raises:
            RuntimeError: the manager is not running (see :meth:`running`).
            BusyError: the session is new and every live session (of the tenant, or in all) is busy.
            SandboxStartError: the interpreter could not be started.
        """
        session = await self._acquire(key, tenant)
        try:
            live = session.live
            if live is not None and (reset or live.workspace != workspace or live.interpreter.exited.is_set()):
                await self._retire(live)
                live = None
            new = live is None
            if live is None:
                group = self._require_group()
                live = await group.start(self._own, session, workspace)
            yield Lease(live.interpreter, live.tools, new, live)
        finally:
            session.last_used = anyio.current_time()
            session.users -= 1
            session.lock.release()
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
        limit = self._settings.max_sessions
        tenant_limit = limit if self._settings.tenant_sessions is None else self._settings.tenant_sessions
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

    async def _own(self, session: _Session, workspace: Path | None, *, task_status: TaskStatus[_Live]) -> None:
        """The owner task of one interpreter of ``session``: open it, keep it until stopped or dead, close it."""
        live: _Live | None = None
        try:
            async with self._open(workspace) as (interpreter, tools):
                live = _Live(interpreter, tools, workspace)
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
        ttl = self._settings.session_ttl
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
