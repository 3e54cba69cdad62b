"""Session-ready sandboxes: sessions' sandboxes started ahead on an empty slot, each to become a conversation's.

A few are kept per host uid (:mod:`.ready_by_uid`), bwrap and Python: each has a session's policy
and limits (and relay, where network may be granted), its runner (``runner.py --ready``, the
session's interpreter to be) imported ``pool_preload`` (or, in every other one, nothing) and
waits for the session's first EXEC, and its ``/workspace`` is a bind of a *slot*, an empty
directory in ``runs/`` made as a conversation's is (0700, the uid's). A bind follows the
directory, not its path: a session claims a sandbox by moving the conversation's entries into the
slot and renaming the slot over the conversation's (now empty) directory (:func:`adopt`), under
the conversation's change lock (``workspace.changes``: no upload lands meanwhile). The sandbox is
the session's until it ends, then destroyed (the files stay); the pool starts another. One whose
adoption failed is destroyed too: its slot held the conversation's entries, so no other
conversation may ever get it (issue 43).
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import anyio
import anyio.to_thread
from anyio.abc import TaskGroup

from mcp_sandbox.config import SandboxSettings, SessionSettings
from mcp_sandbox.engine import ready_sizing
from mcp_sandbox.engine.adoption import SplitAdoptionError, adopt, few_entries
from mcp_sandbox.engine.interpreter import Interpreter
from mcp_sandbox.engine.opener import Opener
from mcp_sandbox.engine.ready_sizing import Arrivals, Mix, ReadyBudget
from mcp_sandbox.engine.scratch import remove_shielded
from mcp_sandbox.engine.tools_view import ToolsView
from mcp_sandbox.errors import BackendUnavailableError, SandboxStartError
from mcp_sandbox.sandbox.policy import Limits

__all__ = ["ReadyPool", "ReadySandbox", "SplitAdoptionError", "adopt"]

logger = logging.getLogger(__name__)

RETRY_SECONDS = 30.0
_CLOSE_SECONDS = 10.0  # how long a session's end may wait for its sandbox to be destroyed
# How long after a session's first run its sandbox's replacement starts: the run's answer (the
# server lists the workspace first) goes out before a start forks on the event loop.
_REFILL_SECONDS = 0.1


@dataclass(eq=False)
class Ticket:
    """A sandbox's place in its pool's stock (starting or idle), from its start until it is claimed or gone."""

    preloaded: bool = True  # the kind of runner it starts (see ReadySandbox.preloaded)
    stocked: bool = True


@dataclass(eq=False)
class ReadySandbox:
    """One session-ready sandbox: its runner's interpreter, ``/tools`` view, slot and limits."""

    interpreter: Interpreter
    tools: ToolsView
    slot: Path
    limits: Limits
    sockets: Path | None  # the directory for the egress proxy's socket (None: it holds no relay)
    pool: ReadyPool = field(repr=False)  # the pool that started it (its replacement comes from there)
    preloaded: bool = True  # its runner imported ``pool_preload`` (else nothing)
    ticket: Ticket = field(default_factory=lambda: Ticket(), repr=False)  # its place in the pool's stock
    claimed: bool = False
    taken: bool = False  # a session's owner task holds it (see held())
    done: anyio.Event = field(default_factory=anyio.Event)  # retired idle, or its session ended
    closed: anyio.Event = field(default_factory=anyio.Event)  # its owner has destroyed it

    def release(self) -> None:
        """The session is over: its owner destroys the sandbox (the conversation's files stay)."""
        self.done.set()

    @contextlib.asynccontextmanager
    async def held(self) -> AsyncIterator[tuple[Interpreter, ToolsView, Path | None]]:
        """Hold this claimed sandbox as a session's (as :meth:`.Opener.session` yields one); destroyed after.

        The wait for its owner to destroy it is bounded and shielded from cancellation.
        """
        self.taken = True
        try:
            yield self.interpreter, self.tools, self.sockets
        finally:
            self.release()
            with anyio.CancelScope(shield=True), anyio.move_on_after(_CLOSE_SECONDS):
                await self.interpreter.kill()
                await self.closed.wait()


class ReadyPool:
    """Session-ready sandboxes of one uid, each owned by a task of the pool's task group.

    They start when the first session asks for one (:meth:`wake`): a server whose runs name no
    conversation keeps none. The pool keeps :attr:`target` of them, starting or idle (its
    *stock*): its floor, or more while new conversations come faster, within the budget of
    every uid (:mod:`.ready_sizing`). :meth:`claim` hands one to a new session (the pool starts
    its replacements, all at once, once that session's first run is over, :meth:`settle`); one
    whose runner died while idle is replaced; one that cannot start stops the pool for
    ``RETRY_SECONDS`` (sessions start from nothing meanwhile).
    """

    def __init__(
        self,
        sessions: SessionSettings,
        sandbox: SandboxSettings,
        opener: Opener,
        *,
        zygotes: bool,
        uid: int | None = None,
        size: int | None = None,
        budget: ReadyBudget | None = None,
    ) -> None:
        """``uid``: the host uid its sandboxes and slots are (None: ``sandbox_uid``); ``size``: its floor at most
        this many; ``budget``: what it may keep above its floor, shared with other uids' pools (None: nothing)."""
        self._sandbox = sandbox
        self._opener = opener
        self.uid = uid
        wanted = sessions.session_ready if size is None else min(size, sessions.session_ready)
        self.floor = wanted if zygotes else 0
        self._budget = ReadyBudget(0) if budget is None else budget
        self._arrivals = Arrivals()
        self.stock = 0  # sandboxes starting (or about to) and idle
        self._mix = Mix(self.floor)  # the stock's kinds
        self._idle: list[ReadySandbox] = []
        self._group: TaskGroup | None = None
        self._retry_at = 0.0
        self._awake = False
        self._retiring = False
        self._owners = 0  # sandboxes starting, idle or serving a session
        self._drained: anyio.Event | None = None  # set when retired and every sandbox is destroyed

    @property
    def idle(self) -> int:
        return len(self._idle)

    @property
    def target(self) -> int:
        """How many to keep now: the floor, or the new conversations of the last ``RATE_WINDOW`` if more."""
        return max(self.floor, self._arrivals.recent()) if self.floor else 0

    def _restock(self, stock: int) -> None:
        """Set the stock, drawing what it holds above the floor from (or giving it back to) the budget."""
        self._budget.used += max(0, stock - self.floor) - max(0, self.stock - self.floor)
        self.stock = stock

    def _unstock(self, ticket: Ticket) -> None:
        if ticket.stocked:
            ticket.stocked = False
            self._mix.remove(ticket.preloaded)
            self._restock(self.stock - 1)

    def _schedule(self, delay: float, preloaded: bool) -> bool:
        """Start one more sandbox after ``delay``, if the pool runs and (above its floor) the budget has room."""
        if self._group is None or self._retiring:
            return False
        if self.stock >= self.floor and not self._budget.room:
            return False
        self._restock(self.stock + 1)
        self._mix.add(preloaded)
        self._group.start_soon(self._own, delay, preloaded, Ticket(preloaded))
        return True

    def _grow(self, delay: float, preloaded: bool) -> None:
        """Start, all at once, as many as the stock lacks of :attr:`target` (as the budget allows): first
        the kinds the floor lacks, then ``preloaded``'s; then swap an idle one for a kind still lacking."""
        while self.stock < self.target:
            lacking = self._mix.lacking()
            if not self._schedule(delay, preloaded if lacking is None else lacking):
                break
        self._rebalance(delay)

    def _rebalance(self, delay: float) -> None:
        """Where the stock lacks a kind of the floor's, stop an idle one of the other kind and start one of it.

        The stock is at its target then (a burst's extra sandboxes, of the kind its runs asked
        for, not yet trimmed, while the one its floor kept of the other kind was claimed): a
        claim of the lacking kind would get the other, and a fork's first run would import
        ``pool_preload`` itself.
        """
        lacking = self._mix.lacking()
        if lacking is None or self._group is None or self._retiring:
            return
        spare = next((idle for idle in reversed(self._idle) if self._mix.surplus(idle.preloaded)), None)
        if spare is not None:
            self._idle.remove(spare)
            self._unstock(spare.ticket)
            spare.release()
            self._schedule(delay, lacking)

    async def _trim(self) -> None:
        """Once new conversations come slower, stop the idle sandboxes above :attr:`target`, newest first.

        Never one of a kind the stock holds no more of than the floor's share (:class:`.Mix`).
        """
        while True:
            await anyio.sleep(ready_sizing.RATE_WINDOW / 2)
            excess = max(0, self.stock - self.target)
            for ready in reversed(list(self._idle)):
                if excess and self._mix.surplus(ready.preloaded):
                    self._idle.remove(ready)
                    self._unstock(ready.ticket)
                    ready.release()
                    excess -= 1

    async def retire(self) -> None:
        """Start no more sandboxes, stop the idle ones, and wait until the sessions born of the rest have ended."""
        self._retiring = True
        self._drained = drained = anyio.Event()
        for ready in self._idle:
            ready.release()
        self._idle.clear()
        if self._owners:
            await drained.wait()

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[ReadyPool]:
        """Keep the pool for this block; every sandbox not claimed stops on the way out."""
        async with anyio.create_task_group() as group:
            self._group = group
            group.start_soon(self._trim)
            try:
                yield self
            finally:
                self._group = None
                for ready in self._idle:
                    ready.release()
                self._idle.clear()
                group.cancel_scope.cancel()

    def wake(self) -> None:
        """Start the pool's sandboxes, if they have not started yet (and the pool is running)."""
        if self._awake or self._group is None or self._retiring:
            return
        self._awake = True
        for index in range(self.floor):
            self._schedule(0.0, index % 2 == 0)  # preloading, light, preloading, ...

    def settle(self, ready: ReadySandbox) -> None:
        """After the first run of the session ``ready`` was claimed for: start what the stock lacks, at once.

        Its replacement (of the same kind), and more while new conversations come faster. Not
        beside that run, nor before its answer (``_REFILL_SECONDS``): a start would slow it on
        two cores. A claimed sandbox no session came to hold (the run was cancelled before its
        owner task started) is destroyed.
        """
        if not ready.taken:
            ready.release()
        self._grow(_REFILL_SECONDS, ready.preloaded)

    async def claim(self, workspace: Path, lock: threading.Lock, *, preloaded: bool = True) -> ReadySandbox | None:
        """A sandbox whose ``/workspace`` is now ``workspace`` (see :func:`adopt`), or None (it stays as it was).

        ``lock``: the conversation's change lock, held for the adoption (no upload lands inside
        it). One whose runner preloaded ``pool_preload`` if ``preloaded`` (the first run names one
        of those modules), else a light one, where one of that kind is idle; else one of the other
        kind (still quicker than a start). Only one whose limits are a session's on ``workspace``
        now (settings reloaded since it started: not that one). A sandbox whose adoption failed
        is destroyed, never offered again: its slot held the conversation's entries. The caller
        calls :meth:`settle` once the session's first run is over.
        """
        self._arrivals.arrive()
        self.wake()
        wanted = self._opener.session_policy(workspace, ()).limits
        while self._idle:
            ready = next((idle for idle in reversed(self._idle) if idle.preloaded == preloaded), self._idle[-1])
            self._idle.remove(ready)
            self._unstock(ready.ticket)
            if ready.interpreter.exited.is_set() or ready.limits != wanted:
                ready.release()
                continue
            ready.claimed = True  # from now on nothing removes its slot: it may hold the conversation's files
            try:
                # A few renames: quicker here than a worker thread's round trip, if no upload is committing.
                if few_entries(workspace) and lock.acquire(blocking=False):
                    try:
                        adopt(ready.slot, workspace)
                    finally:
                        lock.release()
                else:
                    await anyio.to_thread.run_sync(_adopt_locked, ready.slot, workspace, lock)
            except SplitAdoptionError as exc:  # the slot keeps what could not go back: never removed
                logger.error("a session-ready sandbox's slot keeps a conversation's entries: %s", exc)
                ready.release()
                self._grow(0.0, ready.preloaded)
                return None
            except OSError as exc:
                logger.info("a session-ready sandbox was not used (it is destroyed): %s", exc)
                ready.claimed = False  # its slot is empty again: removed with it
                ready.release()
                return None
            return ready
        self._grow(_REFILL_SECONDS, preloaded)  # none idle: a burst; more for the next
        return None

    async def _own(self, delay: float, preloaded: bool, ticket: Ticket) -> None:
        """After ``delay``, start a sandbox on a new slot, offer it, keep it until its session (or the pool) is done."""
        if self._group is None or self._retiring:
            self._unstock(ticket)
            return
        self._owners += 1
        try:
            await self._own_one(delay, preloaded, ticket)
        finally:
            self._unstock(ticket)
            self._owners -= 1
            if self._drained is not None and not self._owners:
                self._drained.set()

    async def _own_one(self, delay: float, preloaded: bool, ticket: Ticket) -> None:
        assert self._group is not None
        if (wait := max(delay, self._retry_at - time.monotonic())) > 0:
            await anyio.sleep(wait)
            if self._retiring or (self.stock > self.target and self._mix.surplus(preloaded)):
                return  # no longer wanted: the burst has passed (the floor's kinds are always wanted)
        layout = self._opener.layout
        try:
            layout.prepare_runs()
            slot = layout.new_scratch()
        except OSError as exc:
            self._retry_at = time.monotonic() + RETRY_SECONDS
            logger.error("no slot for a session-ready sandbox: %s", exc)
            self._unstock(ticket)
            self._grow(0.0, preloaded)
            return
        ready: ReadySandbox | None = None
        try:
            if os.geteuid() == 0:  # as a conversation's directory of the uid's tenant is (WorkspaceStore.ensure)
                uid = self._sandbox.sandbox_uid if self.uid is None else self.uid
                os.chown(slot, uid, self._sandbox.sandbox_gid)
            limits = self._opener.session_policy(slot, ()).limits
            started = self._opener.ready_session(slot, self.uid, preloaded=preloaded)
            async with started as (interpreter, tools, sockets):
                self._opener.pool_started("ready", "python")
                ready = ReadySandbox(interpreter, tools, slot, limits, sockets, self, preloaded, ticket)
                if self._retiring:  # retired while it started
                    ready.release()
                else:
                    self._idle.append(ready)
                async with anyio.create_task_group() as watch:
                    watch.start_soon(_done_on_exit, ready)
                    await ready.done.wait()
                    watch.cancel_scope.cancel()
                if ready in self._idle:
                    self._idle.remove(ready)
                    self._unstock(ticket)
        except (SandboxStartError, BackendUnavailableError, OSError) as exc:
            self._retry_at = time.monotonic() + RETRY_SECONDS
            logger.error("a session-ready sandbox did not start; sessions start from nothing for now: %s", exc)
        finally:
            if ready is not None:
                ready.closed.set()
            self._unstock(ticket)
            if ready is None or not ready.claimed:
                await remove_shielded(slot)  # never a claimed one: it is the conversation's directory now
                self._grow(0.0, preloaded)


def _adopt_locked(slot: Path, workspace: Path, lock: threading.Lock) -> None:
    with lock:
        adopt(slot, workspace)


async def _done_on_exit(ready: ReadySandbox) -> None:
    """An idle sandbox whose runner died is replaced; a claimed one is its session's to notice."""
    await ready.interpreter.exited.wait()
    if not ready.claimed:
        ready.done.set()
