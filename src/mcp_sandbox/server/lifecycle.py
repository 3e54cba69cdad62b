"""The server's life after start: draining on SIGTERM, reloading on SIGHUP.

Draining: from the first SIGTERM no new run starts (the tool call gets a clear error result);
runs already going may finish within ``shutdown_grace`` seconds, then the HTTP server stops
(a second SIGTERM, or SIGINT, stops it at once). Reloading: each registered reloader re-reads
what it owns (tokens, tool allow-lists) and says what changed; sessions and connections stay.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator

import anyio

from mcp_sandbox.errors import BusyError

__all__ = ["DRAINING_MESSAGE", "Draining", "Lifecycle", "Reloader"]

logger = logging.getLogger(__name__)

DRAINING_MESSAGE = "the server is shutting down and starts no new runs; retry once it is back (or on another instance)"

# Re-reads what it owns; returns lines saying what changed. Raises ConfigError for a bad file.
Reloader = Callable[[], list[str]]


class Draining(BusyError):
    """A run was asked for while the server drains (SIGTERM)."""


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
            Draining: the server drains; nothing may start.
        """
        if self.draining:
            raise Draining(DRAINING_MESSAGE)
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

    def reload(self) -> None:
        """Run every reloader; one that fails (a malformed file) keeps what it had and is logged."""
        for name, reloader in self._reloaders:
            try:
                notes = reloader()
            except Exception as exc:  # a bad file must not take the server down: keep the old values
                logger.error("reload of %s failed, the previous values stay: %s", name, exc)
                continue
            for note in notes:
                logger.warning("reload: %s: %s", name, note)
