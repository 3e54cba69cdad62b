"""The sandbox's end of the channel after EXEC: requests to the host and their replies.

Requests (tool calls, tool search, ...) go out as CALL frames with a fresh id; a reader thread,
started with the first request, matches REPLY frames to them by id, so any number of calls can
be in flight at once, from threads or from asyncio tasks. Writes are serialised by a lock, which
the runner also takes to send DONE.
"""

from __future__ import annotations

import itertools
import threading
from concurrent.futures import Future
from typing import Any

from .frames import FrameError, Kind, read_frame, write_frame

__all__ = ["HostConnection", "HostUnavailable", "connect", "connection"]


class HostUnavailable(Exception):
    """The channel to the host is closed or broken; no request can be answered."""


class HostConnection:
    """Requests to the host over the channel fd (thread-safe)."""

    def __init__(self, fd: int) -> None:
        self._fd = fd
        self._ids = itertools.count(1)
        self._lock = threading.Lock()  # guards writes, _pending and _reader
        self._pending: dict[int, Future[dict[str, Any]]] = {}
        self._reader: threading.Thread | None = None
        self._broken: str | None = None

    def send(self, kind: Kind, body: dict[str, Any]) -> None:
        """Write one frame (used by the runner for DONE)."""
        with self._lock:
            write_frame(self._fd, kind, body)

    def request(self, op: str, body: dict[str, Any]) -> Future[dict[str, Any]]:
        """Send request ``op`` and return a future for the host's reply body."""
        future: Future[dict[str, Any]] = Future()
        with self._lock:
            if self._broken is not None:
                future.set_exception(HostUnavailable(self._broken))
                return future
            call_id = next(self._ids)
            self._pending[call_id] = future
            if self._reader is None:
                self._reader = threading.Thread(target=self._read, name="mcp-sandbox-host", daemon=True)
                self._reader.start()
            try:
                write_frame(self._fd, Kind.CALL, {**body, "op": op, "id": call_id})
            except OSError as error:
                del self._pending[call_id]
                future.set_exception(HostUnavailable(f"the channel to the host is closed: {error}"))
        return future

    def _read(self) -> None:
        reason = "the host closed the channel"
        try:
            while (frame := read_frame(self._fd)) is not None:
                kind, body = frame
                if kind is Kind.ERROR:
                    reason = f"the host reported a protocol error: {body.get('message')}"
                    break
                call_id = body.get("id")
                if kind is not Kind.REPLY or not isinstance(call_id, int):
                    continue  # nothing else is addressed to a request
                with self._lock:
                    future = self._pending.pop(call_id, None)
                if future is not None:
                    future.set_result(body)
        except (FrameError, OSError) as error:
            reason = f"the channel to the host broke: {error}"
        with self._lock:
            self._broken = reason
            pending, self._pending = self._pending, {}
        for future in pending.values():
            future.set_exception(HostUnavailable(reason))


_connection: HostConnection | None = None


def connect(fd: int) -> HostConnection:
    """Make ``fd`` the process's connection to the host (the runner calls this once)."""
    global _connection
    _connection = HostConnection(fd)
    return _connection


def connection() -> HostConnection:
    """The process's connection to the host.

    Raises:
        HostUnavailable: not running under the mcp-sandbox runner.
    """
    if _connection is None:
        raise HostUnavailable("not connected to an mcp-sandbox host")
    return _connection
