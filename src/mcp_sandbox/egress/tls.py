"""The server name (SNI) of a TLS ClientHello, read from the first bytes a client sends in a tunnel.

The proxy checks that a CONNECT tunnel carries TLS to the name it was opened for: a client that
opened ``CONNECT allowed.example:443`` and then says ``server_name = other.example`` could reach
another site behind the same address (domain fronting). Only the first record is read, never
decrypted; no TLS library is involved because nothing here terminates TLS. Where the proxy
does terminate it (a host with a secret, :mod:`.intercept`), :class:`Replay` gives the TLS
library the stream with the ClientHello it has already read put back in front.
"""

from __future__ import annotations

from anyio.abc import ByteReceiveStream, ByteStream

__all__ = ["RECORD_HEADER", "Replay", "client_hello_length", "server_name"]

RECORD_HEADER = 5
_HANDSHAKE = 0x16
_CLIENT_HELLO = 0x01
_SERVER_NAME = 0x0000
_HOST_NAME = 0x00


class _Reader:
    def __init__(self, data: bytes) -> None:
        self.data, self.at = data, 0

    def take(self, count: int) -> bytes:
        if self.at + count > len(self.data):
            raise ValueError("truncated")
        piece = self.data[self.at : self.at + count]
        self.at += count
        return piece

    def number(self, size: int) -> int:
        return int.from_bytes(self.take(size), "big")

    def vector(self, size: int) -> bytes:
        return self.take(self.number(size))


def client_hello_length(head: bytes) -> int | None:
    """The full length of the TLS record that ``head`` (at least 5 bytes) starts, or None if it is no handshake."""
    if len(head) < RECORD_HEADER or head[0] != _HANDSHAKE or head[1] != 0x03:
        return None
    return RECORD_HEADER + int.from_bytes(head[3:5], "big")


def server_name(record: bytes) -> str | None:
    """The host name in the ClientHello ``record`` holds (lower case), or None when it names none.

    Raises:
        ValueError: the record is not a complete, well-formed ClientHello.
    """
    reader = _Reader(record)
    if reader.number(1) != _HANDSHAKE:
        raise ValueError("not a TLS handshake record")
    reader.take(2)
    body = _Reader(reader.vector(2))
    if body.number(1) != _CLIENT_HELLO:
        raise ValueError("not a ClientHello")
    hello = _Reader(body.take(body.number(3)))
    hello.take(2 + 32)  # version, random
    hello.vector(1)  # session id
    hello.vector(2)  # cipher suites
    hello.vector(1)  # compression methods
    if hello.at == len(hello.data):
        return None  # no extensions
    extensions = _Reader(hello.vector(2))
    while extensions.at < len(extensions.data):
        kind = extensions.number(2)
        data = extensions.vector(2)
        if kind != _SERVER_NAME:
            continue
        names = _Reader(_Reader(data).vector(2))
        while names.at < len(names.data):
            name_type = names.number(1)
            name = names.vector(2)
            if name_type == _HOST_NAME:
                try:
                    return name.decode("ascii").lower()
                except UnicodeDecodeError as exc:
                    raise ValueError("a server name that is not ASCII") from exc
        return None
    return None


class Replay(ByteStream):
    """``reader`` (with ``first`` put back in front of it) to receive from, ``writer`` to send to."""

    def __init__(self, reader: ByteReceiveStream, writer: ByteStream, first: bytes) -> None:
        self._reader, self._writer, self._first = reader, writer, first

    async def receive(self, max_bytes: int = 65536) -> bytes:
        if self._first:
            piece, self._first = self._first[:max_bytes], self._first[max_bytes:]
            return piece
        return await self._reader.receive(max_bytes)

    async def send(self, item: bytes) -> None:
        await self._writer.send(item)

    async def send_eof(self) -> None:
        await self._writer.send_eof()

    async def aclose(self) -> None:
        await self._writer.aclose()
