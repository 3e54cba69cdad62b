"""The sandbox's end of the channel: the one reader of the socket, and requests to the host.

One reader thread, for the process's lifetime, reads every frame with ``recvmsg`` (a plain
``read`` would drop the descriptors an EXEC frame carries): REPLY frames go to the requests
waiting for them, matched by id, so any number of calls can be in flight at once, from threads
or from asyncio tasks; every other frame (EXEC with its descriptors) is queued for the runner's
main thread. Requests (tool calls, tool search, ...) go out as CALL frames with a fresh id.
Writes are serialised by a lock, which the runner also takes to send READY, DONE and DISPLAY.
"""

from __future__ import annotations

import _socket
import itertools
import os
import struct
import threading
from queue import SimpleQueue
from typing import TYPE_CHECKING, Any

from .frames import (
    DEFAULT_MAX_FRAME,
    HEADER,
    Call,
    Error,
    Failure,
    Frame,
    FrameError,
    FrameParser,
    Kind,
    Reply,
    decode,
    pack,
)

if TYPE_CHECKING:
    # Imported on the first request: concurrent.futures pulls in logging, a cost every start would pay.
    from concurrent.futures import Future

__all__ = ["Command", "HostConnection", "HostUnavailable", "close_fds", "connect", "connection", "fds_of"]

# (a frame, the descriptors that came with it); the receiver owns (closes) the descriptors.
Command = tuple[Frame, list[int]]

_CHUNK = 1 << 16
_MAX_CHUNK = 1 << 20
_MAX_FDS = 8  # the host sends two; room for more so that extras are seen (and closed), not cut


class HostUnavailable(Exception):
    """The channel to the host is closed or broken; no request can be answered."""


def fds_of(ancillary: list[tuple[int, int, bytes]]) -> list[int]:
    fds: list[int] = []
    for level, kind, data in ancillary:
        if level == _socket.SOL_SOCKET and kind == _socket.SCM_RIGHTS:
            count = len(data) // 4
            fds.extend(struct.unpack(f"{count}i", data[: count * 4]))
    return fds


def close_fds(fds: list[int]) -> None:
    for fd in fds:
        try:
            os.close(fd)
        except OSError:
            pass


class HostConnection:
    """The channel to the host over socket ``fd`` (thread-safe). Owns a duplicate of ``fd``."""

    def __init__(self, fd: int, max_frame: int = DEFAULT_MAX_FRAME) -> None:
        self._sock = _socket.socket(fileno=os.dup(fd))
        self._parser = FrameParser(max_frame)
        self._ids = itertools.count(1)
        self._lock = threading.Lock()  # guards writes, _pending, _broken and _reader
        self._pending: dict[int, Future[Reply]] = {}
        self._commands: SimpleQueue[Command | None] = SimpleQueue()
        self._reader: threading.Thread | None = None
        self._broken: str | None = None
        self.failed = False  # the channel broke (rather than ended cleanly)
        self.max_call_bytes: int | None = None  # the host's limit on a request (set per run, from EXEC)
        self._fds: list[int] = []  # received, not yet claimed by an EXEC frame

    @property
    def broken(self) -> str | None:
        """Why the channel is no longer usable, or None while it is."""
        return self._broken

    def fileno(self) -> int:
        """The descriptor of the channel socket."""
        return self._sock.fileno()

    def start(self) -> None:
        """Start the reader thread (idempotent; the first request also starts it)."""
        with self._lock:
            self._start_locked()

    def _start_locked(self) -> None:
        if self._reader is None:
            self._reader = threading.Thread(target=self._read, name="mcp-sandbox-host", daemon=True)
            self._reader.start()

    def send(self, frame: Frame) -> None:
        """Write one frame.

        Raises:
            OSError: the channel is closed.
        """
        data = pack(frame)
        with self._lock:
            self._sock.sendall(data)

    def request(self, op: str, body: dict[str, Any]) -> Future[Reply]:
        """Send request ``op`` with the fields ``body`` and return a future for the host's REPLY."""
        from concurrent.futures import Future

        future: Future[Reply] = Future()
        with self._lock:
            if self._broken is not None:
                future.set_exception(HostUnavailable(self._broken))
                return future
            call_id = next(self._ids)
            data = pack(Call(call_id, {**body, "op": op}))
            limit = self.max_call_bytes
            if limit is not None and len(data) - HEADER.size > limit:
                # The host would end the run on such a frame: the code gets an error it can handle.
                message = f"the request is {len(data) - HEADER.size} bytes, over the server's max_call_bytes ({limit})"
                future.set_result(Reply(call_id, error=Failure("invalid", message)))
                return future
            self._pending[call_id] = future
            self._start_locked()
            try:
                self._sock.sendall(data)
            except OSError as error:
                del self._pending[call_id]
                future.set_exception(HostUnavailable(f"the channel to the host is closed: {error}"))
        return future

    def next_command(self) -> Command | None:
        """Block until the host sends a frame other than a REPLY; ``None`` when the channel ended."""
        self.start()
        command = self._commands.get()
        if command is None:
            self._commands.put(None)  # every later call sees the end too
        return command

    def close(self) -> None:
        """Close this side's socket (the reader thread ends with it)."""
        try:
            self._sock.shutdown(_socket.SHUT_RDWR)
        except OSError:
            pass
        if self._reader is not None and self._reader is not threading.current_thread():
            self._reader.join()
        self._sock.close()
        close_fds(self._fds)
        self._fds = []

    def _receive(self) -> bool:
        """Read what the socket has into the parser; False at the end of the stream."""
        size = min(max(self._parser.wanted(), _CHUNK), _MAX_CHUNK)
        data, ancillary, flags, _ = self._sock.recvmsg(size, _socket.CMSG_SPACE(_MAX_FDS * 4), _socket.MSG_CMSG_CLOEXEC)
        self._fds.extend(fds_of(ancillary))
        if flags & _socket.MSG_CTRUNC:
            raise FrameError("the host sent more descriptors than a frame may carry")
        if not data:
            self._parser.check_end()
            return False
        self._parser.feed(data)
        return True

    def _read(self) -> None:
        reason = "the host closed the channel"
        failed = False
        try:
            while self._receive():
                while (raw := self._parser.next()) is not None:
                    frame = decode(*raw)
                    if isinstance(frame, Error):
                        reason = f"the host reported a protocol error: {frame.message}"
                        failed = True
                        return
                    self._dispatch(frame)
        except FrameError as error:
            reason = f"the channel to the host broke: {error}"
            failed = True
            try:
                self.send(Error(str(error)))
            except OSError:
                pass
        except OSError as error:
            reason = f"the channel to the host broke: {error}"
            failed = True
        finally:
            self._end(reason, failed)

    def _dispatch(self, frame: Frame) -> None:
        """Route one frame (not an ERROR): a REPLY to its request, any other to the runner."""
        if isinstance(frame, Reply):
            with self._lock:
                future = self._pending.pop(frame.id, None)
            # False when the caller gave up on it (a cancelled asyncio task); it cannot give up after.
            if future is not None and future.set_running_or_notify_cancel():
                future.set_result(frame)
            return  # a reply nobody waits for any more is dropped
        fds: list[int] = []
        if frame.KIND is Kind.EXEC:
            fds, self._fds = self._fds, []
        self._commands.put((frame, fds))

    def _end(self, reason: str, failed: bool) -> None:
        with self._lock:
            self._broken = reason
            self.failed = failed
            pending, self._pending = self._pending, {}
        for future in pending.values():
            if future.set_running_or_notify_cancel():
                future.set_exception(HostUnavailable(reason))
        self._commands.put(None)


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
