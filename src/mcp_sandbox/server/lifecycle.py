"""The server's life after start: draining on SIGTERM, reloading on SIGHUP.

Draining: from the first SIGTERM no new run or upload starts (the call gets a clear error);
runs already going may finish within ``shutdown_grace`` seconds. Those still going then are
stopped (their sandboxes killed) and answered with an error result saying the server stopped,
and the HTTP server stops once those answers are out. A second SIGTERM, or SIGINT, does the
same at once. Whoever registered with :meth:`Lifecycle.on_drain` is called as the drain begins
and once the runs are done (a replica gives back its leases). Reloading: each registered
reloader re-reads what it owns (tokens, tool allow-lists) and says what changed; sessions and
connections stay.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import socket
import time
from collections.abc import Awaitable, Callable, Iterator
from types import FrameType
from typing import Any

import anyio
import uvicorn
from uvicorn.server import ServerState

from mcp_sandbox.errors import BusyError

__all__ = [
    "DRAINING_MESSAGE",
    "STOPPED_MESSAGE",
    "DrainingServer",
    "Lifecycle",
    "Reloader",
    "StopSignals",
    "stop_signals",
]

logger = logging.getLogger(__name__)

DRAINING_MESSAGE = "the server is shutting down and starts no new runs; retry once it is back (or on another instance)"
STOPPED_MESSAGE = (
    "the server stopped (it was shut down) before the run finished; the sandbox and its processes were killed: "
    "run it again once the server is back (or on another instance)"
)
# How long runs stopped at shutdown have to be answered (their sandboxes killed, results sent).
ANSWER_SECONDS = 5.0

# Re-reads what it owns (on the event loop: slow reads go to a worker thread inside it); returns
# lines saying what changed. Raises ConfigError for a bad file.
Reloader = Callable[[], Awaitable[list[str]]]


class Lifecycle:
    """Counts the runs going on, refuses new ones while draining, and keeps the reloaders."""

    def __init__(self) -> None:
        self.draining = False
        self.runs = 0
        self._idle = anyio.Event()
        self._idle.set()
        self._reloaders: list[tuple[str, Reloader]] = []
        self._draining: list[Callable[[], Awaitable[None]]] = []
        self._drained: list[Callable[[], Awaitable[None]]] = []
        self._scopes: set[anyio.CancelScope] = set()
        self._stopping = False

    @contextlib.contextmanager
    def run(self) -> Iterator[anyio.CancelScope]:
        """Count one run for the block; the caller runs it inside the scope yielded, which
        :meth:`stop_runs` cancels (``cancelled_caught``: answer with :data:`STOPPED_MESSAGE`).

        Raises:
            BusyError: the server drains (SIGTERM); nothing may start.
        """
        self.refuse_when_draining()
        if self.runs == 0:
            self._idle = anyio.Event()
        self.runs += 1
        scope = anyio.CancelScope()
        self._scopes.add(scope)
        if self._stopping:
            scope.cancel()
        try:
            yield scope
        finally:
            self._scopes.discard(scope)
            self.runs -= 1
            if self.runs == 0:
                self._idle.set()

    def refuse_when_draining(self) -> None:
        """Raise if the server drains: nothing new (a run, an upload) may start.

        Raises:
            BusyError: the server drains (SIGTERM).
        """
        if self.draining:
            raise BusyError(DRAINING_MESSAGE)

    def stop_runs(self) -> None:
        """Stop every run going on now (each is answered, see :meth:`run`); on the event loop."""
        self._stopping = True
        for scope in self._scopes:
            scope.cancel()

    async def drain(self, grace: float, now: anyio.Event | None = None) -> bool:
        """Refuse new runs from now on and wait up to ``grace`` seconds (or until ``now`` is set) for
        those going on; stop those still going and wait (bounded) until they are answered.
        True if all finished within the grace."""
        self.draining = True
        logger.warning("draining: no new runs; %d running get %g s to finish", self.runs, grace)
        for draining in self._draining:
            await draining()
        with anyio.move_on_after(grace):
            async with anyio.create_task_group() as group:

                async def wake() -> None:
                    if now is not None:
                        await now.wait()
                        group.cancel_scope.cancel()

                group.start_soon(wake)
                await self._idle.wait()
                group.cancel_scope.cancel()
        finished = self.runs == 0
        if not finished:
            logger.warning("draining: %d runs still going are stopped", self.runs)
            self.stop_runs()
            with anyio.move_on_after(ANSWER_SECONDS):
                await self._idle.wait()
        for drained in self._drained:
            await drained()
        return finished

    def on_drain(self, start: Callable[[], Awaitable[None]], end: Callable[[], Awaitable[None]]) -> None:
        """Call ``start`` when the drain begins and ``end`` once the runs are finished or stopped
        (a replica gives back the leases no call uses, then all of them)."""
        self._draining.append(start)
        self._drained.append(end)

    def on_reload(self, name: str, reloader: Reloader) -> None:
        self._reloaders.append((name, reloader))

    async def reload(self) -> None:
        """Run every reloader; one that fails (a malformed file) keeps what it had and is logged."""
        for name, reloader in self._reloaders:
            try:
                notes = await reloader()
            except Exception as exc:  # a bad file must not take the server down: keep the old values
                logger.error("reload of %s failed, the previous values stay: %s", name, exc)
                continue
            for note in notes:
                logger.warning("reload: %s: %s", name, note)


class StopSignals:
    """SIGTERM and SIGINT over an HTTP server's whole life (see :func:`stop_signals`)."""

    def __init__(self, starting: anyio.CancelScope, caught: list[int]) -> None:
        self.caught = caught
        self.serving = False  # set by DrainingServer, whose own handler takes over while it serves
        self._starting = starting
        self._loop = asyncio.get_running_loop()

    def handle(self, sig: int, frame: FrameType | None) -> None:
        self.caught.append(sig)
        if not self.serving:
            self._loop.call_soon_threadsafe(self._starting.cancel)


@contextlib.contextmanager
def stop_signals(starting: anyio.CancelScope, caught: list[int]) -> Iterator[StopSignals]:
    """Handle SIGTERM and SIGINT for the block (``caught``: those that came before, recorded by
    the CLI from its start, cancel ``starting`` at once): before the server serves, one cancels ``starting``
    (the start-up is abandoned and what opened closes in order); while it serves,
    :class:`DrainingServer`'s handler has them; after it, they are only recorded (the engine and
    the bridge close in order, bounded).

    Without it a signal during start-up (opening the service takes seconds: the warm pool, the
    downstream servers) found the default action and killed the process with nothing closed,
    and one after uvicorn's shutdown, or before its handler, landed on a no-op: ignored.
    """
    signals = StopSignals(starting, caught)
    previous = {sig: signal.signal(sig, signals.handle) for sig in (signal.SIGINT, signal.SIGTERM)}
    if caught:
        starting.cancel()
    try:
        yield signals
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


class DrainingServer(uvicorn.Server):
    """uvicorn's server, whose first SIGTERM drains (see :class:`Lifecycle`) before it stops.

    uvicorn's own handler would stop accepting and then wait for every open connection,
    including MCP event streams that never end; this one first lets the runs finish, answering
    new ones with an error, and then hands over to uvicorn's shutdown for what is left of the grace.
    """

    def __init__(
        self,
        config: uvicorn.Config,
        lifecycle: Lifecycle,
        grace: float,
        signals: StopSignals,
        also: Callable[[ServerState, dict[str, Any]], Awaitable[list[asyncio.Server]]] | None = None,
    ) -> None:
        super().__init__(config)
        self._lifecycle = lifecycle
        self._grace = grace
        self._signals = signals
        self._also = also
        self._wake: Callable[[bool], None] | None = None
        self._at_once = False

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        """uvicorn's start, and then ``also``'s servers (the internal listener) beside it: closed,
        drained and stopped with the others."""
        await super().startup(sockets)
        if self._also is not None and self.started:
            self.servers += await self._also(self.server_state, self.lifespan.state)

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if self._wake is None:
            super().handle_exit(sig, frame)
            return
        # Both kinds refuse new runs from this instant; the drain task does the rest.
        if self._at_once:  # a third signal: not even the open connections are waited for
            self.force_exit = True
            return
        self._at_once = sig != signal.SIGTERM or self._lifecycle.draining
        self._lifecycle.draining = True
        self._wake(self._at_once)

    async def serve_draining(self, sockets: list[socket.socket]) -> None:
        """Serve on ``sockets`` until SIGINT, or SIGTERM and the drain; SIGHUP runs the lifecycle's reloaders."""
        term = anyio.Event()
        now = anyio.Event()  # a second SIGTERM, or SIGINT: stop the runs at once
        # A signal handler may not touch the event loop's objects directly: the wake-up is
        # scheduled thread-safely on the loop (uvicorn runs on asyncio).
        loop = asyncio.get_running_loop()

        def wake(at_once: bool) -> None:
            loop.call_soon_threadsafe(term.set)
            if at_once:
                loop.call_soon_threadsafe(now.set)

        self._wake = wake
        self._signals.serving = True
        for sig in self._signals.caught:  # they came while the server started: it stops at once
            self.handle_exit(sig, None)

        async def drain() -> None:
            await term.wait()
            started = time.monotonic()
            await self._lifecycle.drain(0 if now.is_set() else self._grace, now)
            # What is left (open event streams) gets the rest of the grace, or a second when stopped at once.
            left = 1 if now.is_set() else self._grace - (time.monotonic() - started)
            self.config.timeout_graceful_shutdown = max(1, round(left))
            self.should_exit = True
            if not now.is_set():
                await now.wait()
                self.force_exit = True  # a second signal during uvicorn's own wait for connections ends it

        async def reload() -> None:
            with anyio.open_signal_receiver(signal.SIGHUP) as signals:
                async for _ in signals:
                    await self._lifecycle.reload()

        async with anyio.create_task_group() as group:
            group.start_soon(drain)
            group.start_soon(reload)
            await self.serve(sockets)
            group.cancel_scope.cancel()
