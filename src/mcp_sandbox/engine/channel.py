"""The host's end of the frame channel (asyncio), over the shared frame codec."""

from __future__ import annotations

import asyncio
import socket
from typing import Any

from mcp_sandbox.errors import ChannelError, FrameError
from mcp_sandbox.runners.python.mcp_sandbox_runtime import frames
from mcp_sandbox.runners.python.mcp_sandbox_runtime.frames import Kind

__all__ = ["Channel", "Kind"]


class Channel:
    """Reads and writes frames on the host end of a sandbox's channel socket."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, max_frame: int) -> None:
        self._reader = reader
        self._writer = writer
        self._max_frame = max_frame
        # Replies to concurrent tool calls are sent from several tasks: one frame at a time.
        self._sending = asyncio.Lock()

    @classmethod
    async def open(cls, sock: socket.socket, max_frame: int) -> Channel:
        reader, writer = await asyncio.open_unix_connection(sock=sock, limit=1 << 20)
        return cls(reader, writer, max_frame)

    async def send(self, kind: Kind, body: dict[str, Any]) -> None:
        """Send one frame.

        Raises:
            ChannelError: the sandbox end is gone.
        """
        data = frames.encode(kind, body)
        try:
            async with self._sending:
                self._writer.write(data)
                await self._writer.drain()
        except (ConnectionError, OSError) as exc:
            raise ChannelError(f"the sandbox closed its channel: {exc}") from exc

    async def receive(self) -> tuple[Kind, dict[str, Any]] | None:
        """Receive one frame; ``None`` when the sandbox closed the channel cleanly.

        Raises:
            FrameError: the sandbox sent something that is not a valid frame.
        """
        try:
            header = await self._reader.readexactly(frames.HEADER.size)
        except asyncio.IncompleteReadError as exc:
            if not exc.partial:
                return None
            raise FrameError("channel closed in the middle of a frame header") from exc
        except (ConnectionError, OSError):
            return None
        try:
            kind, length = frames.parse_header(header, self._max_frame)
            payload = await self._reader.readexactly(length)
            return kind, frames.decode_body(payload)
        except frames.FrameError as exc:
            raise FrameError(str(exc)) from exc
        except asyncio.IncompleteReadError as exc:
            raise FrameError("channel closed in the middle of a frame") from exc

    def close(self) -> None:
        self._writer.close()
