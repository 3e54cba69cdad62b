"""The server's life after start: draining on SIGTERM, reloading on SIGHUP.

Draining: from the first SIGTERM no new run starts (the tool call gets a clear error result);
runs already going may finish within ``shutdown_grace`` seconds, then the HTTP server stops
(a second SIGTERM, or SIGINT, stops it at once). Reloading: each registered reloader re-reads
what it owns (tokens, tool allow-lists) and says what changed; sessions and connections stay.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import time
from collections.abc import Awaitable, Callable, Iterator
from types import FrameType

import anyio
import uvicorn

from mcp_sandbox.errors import BusyError

__all__ = ["DRAINING_MESSAGE", "DrainingServer", "Lifecycle", "Reloader"]

logger = logging.getLogger(__name__)

DRAINING_MESSAGE = "the server is shutting down and starts no new runs; retry once it is back (or on another instance)"

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

    @contextlib.contextmanager
    def run(self) -> Iterator[None]:
        """Count one run for the block.

        Raises:
            BusyError: the server drains (SIGTERM); nothing may start.
        """
        if self.draining:
            raise BusyError(DRAINING_MESSAGE)
        if self.runs == 0:
            self._idle = anyio.Event()
        self.runs += 1
        try:
            yield
        finally:
            self.runs -= 1
            if self.runs == 0:
                self._idle.set()

    async def drain(self, grace: float) -> bool:
        """Refuse new runs from now on and wait up to ``grace`` seconds for those going on; True if all finished."""
        self.draining = True
        logger.warning("draining: no new runs; %d running get %g s to finish", self.runs, grace)
        with anyio.move_on_after(grace):
            await self._idle.wait()
        if self.runs:
            logger.warning("draining: %d runs still going after %g s are cut short", self.runs, grace)
        return self.runs == 0

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


class DrainingServer(uvicorn.Server):
    """uvicorn's server, whose first SIGTERM drains (see :class:`Lifecycle`) before it stops.

    uvicorn's own handler would stop accepting and then wait for every open connection,
    including MCP event streams that never end; this one first lets the runs finish, answering
    new ones with an error, and then hands over to uvicorn's shutdown for what is left of the grace.
    """

    def __init__(self, config: uvicorn.Config, lifecycle: Lifecycle, grace: float) -> None:
        super().__init__(config)
        self._lifecycle = lifecycle
        self._grace = grace
        self._wake: Callable[[], object] | None = None

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if sig == signal.SIGTERM and self._wake is not None and not self._lifecycle.draining:
            self._lifecycle.draining = True  # refuse new runs from this instant
            self._wake()
            return
        super().handle_exit(sig, frame)

    async def serve_draining(self) -> None:
        """Serve until SIGINT, or SIGTERM and the drain; SIGHUP runs the lifecycle's reloaders."""
        term = anyio.Event()
        # A signal handler may not touch the event loop's objects directly: the wake-up is
        # scheduled thread-safely on the loop (uvicorn runs on asyncio).
        loop = asyncio.get_running_loop()
        self._wake = lambda: loop.call_soon_threadsafe(term.set)

        async def drain() -> None:
            await term.wait()
            started = time.monotonic()
            await self._lifecycle.drain(self._grace)
            self.config.timeout_graceful_shutdown = max(1, round(self._grace - (time.monotonic() - started)))
            self.should_exit = True

        async def reload() -> None:
            with anyio.open_signal_receiver(signal.SIGHUP) as signals:
                async for _ in signals:
                    await self._lifecycle.reload()

        async with anyio.create_task_group() as group:
            group.start_soon(drain)
            group.start_soon(reload)
            await self.serve()
            group.cancel_scope.cancel()
