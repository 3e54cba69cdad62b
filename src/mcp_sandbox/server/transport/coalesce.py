"""A connection's transport that sends a response's head with its body: one TCP segment, one wake-up of the client.

uvicorn's HTTP protocols (h11's, httptools') write a response's status line and headers as soon
as the app starts it, and its body as a second write; each write is a segment and the client often wakes for the
head alone, then again for the body (nearly half the calls forwarded between replicas did,
docs/performance.md). Here a write is held until the next one, which takes it along at once,
or until the event loop's current step ends; closing sends what is held first. Nothing waits
behind work the app does after its answer. Everything else is the transport's own.
"""

from __future__ import annotations

import asyncio
from typing import Any

__all__ = ["CoalescingTransport"]


class CoalescingTransport(asyncio.Transport):
    """``transport``, a write held until the next (sent together) or the end of ``loop``'s current step."""

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__()
        self._transport = transport
        self._loop = loop
        self._held: bytes | None = None

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if not data:
            return
        if self._held is None:  # held until the next write or the end of this step
            self._held = bytes(data)
            self._loop.call_soon(self.flush)
            return
        held, self._held = self._held, None
        if not self._transport.is_closing():
            self._transport.write(held + bytes(data))

    def writelines(self, list_of_data: Any) -> None:
        for data in list_of_data:
            self.write(data)

    def flush(self) -> None:
        """Send what is held now."""
        held, self._held = self._held, None
        if held is not None and not self._transport.is_closing():
            self._transport.write(held)

    def close(self) -> None:
        self.flush()
        self._transport.close()

    def abort(self) -> None:
        self._held = None
        self._transport.abort()

    def is_closing(self) -> bool:
        return self._transport.is_closing()

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return self._transport.get_extra_info(name, default)

    def pause_reading(self) -> None:
        self._transport.pause_reading()

    def resume_reading(self) -> None:
        self._transport.resume_reading()

    def is_reading(self) -> bool:
        return self._transport.is_reading()

    def set_protocol(self, protocol: asyncio.BaseProtocol) -> None:
        self.flush()
        self._transport.set_protocol(protocol)

    def get_protocol(self) -> asyncio.BaseProtocol:
        return self._transport.get_protocol()

    def can_write_eof(self) -> bool:
        return self._transport.can_write_eof()

    def write_eof(self) -> None:
        self.flush()
        self._transport.write_eof()

    def get_write_buffer_size(self) -> int:
        return self._transport.get_write_buffer_size() + len(self._held or b"")

    def get_write_buffer_limits(self) -> tuple[int, int]:
        return self._transport.get_write_buffer_limits()

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        self._transport.set_write_buffer_limits(high, low)
