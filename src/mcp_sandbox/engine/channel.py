"""The host's end of the frame channel (anyio, on the non-blocking socket), over the shared frame codec.

Frames go out and come in as the codec's typed objects (``Exec``, ``Done``, ...); a frame from the
sandbox is hostile input, decoded with every field's type checked. Each kind has its own size
limit (``limits``): a header over it is refused before its body is read, so a run cannot make
the host buffer more than the largest frame it may legitimately send; a body over
:data:`OFF_LOOP_BYTES` is decoded in a worker thread, never on the event loop.

The socket is used directly rather than through asyncio streams: a frame may carry
descriptors (``SCM_RIGHTS`` on its first bytes, sent with ``sendmsg``), which a stream
transport cannot send. Descriptors the sandbox sends the other way are never accepted (a
plain ``recv`` makes the kernel close them).
"""

from __future__ import annotations

import array
import socket
from collections.abc import Mapping, Sequence

import anyio
import anyio.to_thread

from mcp_sandbox import protocol as frames
from mcp_sandbox.errors import ChannelError
from mcp_sandbox.protocol import Frame, Kind

__all__ = ["OFF_LOOP_BYTES", "Channel"]

# Bodies larger than this are parsed in a worker thread (parsing one would hold up the event loop).
OFF_LOOP_BYTES = 256 << 10

_MIN_READ = 64 << 10
_MAX_READ = 1 << 20


class Channel:
    """Reads and writes frames on the host end of a sandbox's channel socket.

    One task at a time may receive; any number may send (one frame at a time).
    """

    def __init__(self, sock: socket.socket, max_frame: int, limits: Mapping[Kind, int] | None = None) -> None:
        sock.setblocking(False)
        self._sock = sock
        self._parser = frames.FrameParser(max_frame, limits)
        # Uncontended (nearly always: one EXEC per run, one REPLY per call), taking it does not
        # yield to the event loop: a frame sent is one loop iteration fewer per run.
        self._sending = anyio.Lock(fast_acquire=True)
        self._ended = False

    async def send(self, frame: Frame, fds: Sequence[int] = ()) -> None:
        """Send one frame; ``fds`` (if any) travel with its first bytes.

        The caller keeps its own copies of ``fds`` (close them once this returns).

        Raises:
            ChannelError: the sandbox end is gone.
        """
        view = memoryview(frames.pack(frame))
        ancillary = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))] if fds else []
        try:
            async with self._sending:
                while view:
                    sent = await self._send_some(view, ancillary)
                    ancillary = []  # the descriptors went with the first bytes
                    view = view[sent:]
        except (OSError, anyio.ClosedResourceError) as exc:
            raise ChannelError(f"the sandbox closed its channel: {exc!r}") from exc

    async def _send_some(self, view: memoryview, ancillary: list[tuple[int, int, array.array[int]]]) -> int:
        while True:
            try:
                if ancillary:
                    return self._sock.sendmsg([view], ancillary)
                return self._sock.send(view)
            except BlockingIOError:
                await anyio.wait_writable(self._sock)

    async def receive(self) -> Frame | None:
        """Receive one frame; ``None`` when the sandbox closed the channel cleanly.

        Raises:
            FrameError: the sandbox sent something that is not a valid frame (bytes or fields).
        """
        while (raw := self._parser.next_payload()) is None:
            if self._ended or not await self._fill():
                self._ended = True
                self._parser.check_end()
                return None
        kind, payload = raw
        if len(payload) > OFF_LOOP_BYTES:
            body = await anyio.to_thread.run_sync(frames.decode_body, payload)
        else:
            body = frames.decode_body(payload)
        return frames.decode(kind, body)

    async def _fill(self) -> bool:
        """Read what the socket has into the parser; False at the end of the stream."""
        size = min(max(self._parser.wanted(), _MIN_READ), _MAX_READ)
        while True:
            try:
                data = self._sock.recv(size)
            except BlockingIOError:
                try:
                    await anyio.wait_readable(self._sock)
                except anyio.ClosedResourceError:
                    return False  # closed by the host while waiting (the sandbox was killed)
                continue
            except OSError:
                return False  # reset by a sandbox that died, or closed: an end like any other
            if not data:
                return False
            self._parser.feed(data)
            return True

    def close(self) -> None:
        if self._sock.fileno() >= 0:
            anyio.notify_closing(self._sock)
            self._sock.close()
