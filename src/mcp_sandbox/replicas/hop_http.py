"""The internal hop's HTTP/1.1 wire: a POST's head written, an answer read, on a kept-alive byte stream.

Written here rather than with h11: the hop sends one kind of request, whose head is ours, and
reads the answers of a peer replica's server; h11's general event machinery (header validation
by regular expressions, its state machine) cost more CPU per call than the rest of the hop's
client (docs/performance.md, forwarding between replicas). The answer is read strictly: a
status line, headers, then a body framed by ``content-length``, by chunks, or by the end of the
connection; anything else is a :class:`WireError`, and a connection is kept for the next request
only when its answer said nothing against it and left no byte over.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import anyio
import anyio.abc

__all__ = ["Answer", "Reader", "WireError", "request_head"]

_CHUNK = 1 << 16
_MAX_HEAD = 64 << 10  # the answer's status line and headers
_STATUS = re.compile(rb"HTTP/1\.([01]) ([1-9][0-9]{2})(?: [^\r\n]*)?")
_TOKEN = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")
_NO_BODY = frozenset({204, 304})


class WireError(Exception):
    """The answer is not well-formed HTTP/1.1, or the connection ended before it did."""


@dataclass(frozen=True, slots=True)
class Answer:
    status: int
    body: bytes
    keep: bool  # the connection may carry the next request


def request_head(host: str, target: str, length: int, headers: list[tuple[str, str]]) -> bytes:
    """A POST's request line and headers for a body of ``length`` bytes.

    Raises:
        ValueError: a header name that is not a token, or a value, host or target that would
            split the head (a CR, LF or NUL; a space in the target).
    """
    if not target.startswith("/") or any(c in target for c in " \r\n\0") or any(c in host for c in "\r\n\0 "):
        raise ValueError(f"not a request target and host: {target!r}, {host!r}")
    lines = [f"POST {target} HTTP/1.1", f"host: {host}", f"content-length: {length}"]
    for name, value in headers:
        if not _TOKEN.fullmatch(name) or any(c in value for c in "\r\n\0"):
            raise ValueError(f"a header that cannot be sent: {name!r}")
        lines.append(f"{name}: {value}")
    lines.append("\r\n")
    return "\r\n".join(lines).encode("latin-1")


class Reader:
    """Answers read from ``stream``; what a read brought beyond an answer is kept for the next."""

    def __init__(self, stream: anyio.abc.ByteStream) -> None:
        self._stream = stream
        self._buffer = bytearray()

    @property
    def pending(self) -> bool:
        """Bytes arrived beyond the last answer (a peer that sent what was not asked)."""
        return bool(self._buffer)

    async def _more(self) -> bool:
        """Read what arrived into the buffer; False at the end of the stream."""
        try:
            self._buffer += await self._stream.receive(_CHUNK)
        except anyio.EndOfStream:
            return False
        return True

    async def _line(self, limit: int) -> bytes:
        start = 0
        while (end := self._buffer.find(b"\r\n", start)) < 0:
            if len(self._buffer) > limit:
                raise WireError("a line of the answer is too long")
            start = max(len(self._buffer) - 1, 0)
            if not await self._more():
                raise WireError("the connection was closed before the answer")
        line = bytes(self._buffer[:end])
        del self._buffer[: end + 2]
        return line

    async def _exactly(self, size: int) -> bytes:
        while len(self._buffer) < size:
            if not await self._more():
                raise WireError("the connection was closed in the middle of the answer")
        data = bytes(self._buffer[:size])
        del self._buffer[:size]
        return data

    async def _head(self) -> tuple[int, bool, dict[bytes, bytes]]:
        """The status, whether the answer is HTTP/1.1, and the headers (names in lower case)."""
        while True:
            matched = _STATUS.fullmatch(await self._line(_MAX_HEAD))
            if matched is None:
                raise WireError("not an HTTP/1.x status line")
            headers: dict[bytes, bytes] = {}
            size = 0
            while line := await self._line(_MAX_HEAD):
                size += len(line)
                name, colon, value = line.partition(b":")
                if not colon or size > _MAX_HEAD or name != name.strip() or not name:
                    raise WireError("a malformed header in the answer")
                name, value = name.lower(), value.strip(b" \t")
                if name in headers and name in (b"content-length", b"transfer-encoding"):
                    raise WireError("a repeated framing header in the answer")
                headers[name] = headers[name] + b", " + value if name in headers else value
            status = int(matched.group(2))
            if status >= 200:
                return status, matched.group(1) == b"1", headers
            # an interim answer (100 Continue): the final one follows

    async def answer(self) -> Answer:
        """The next answer, whole.

        Raises:
            WireError: a malformed answer, or the connection ended before it did.
        """
        status, http11, headers = await self._head()
        keep = http11 and b"close" not in headers.get(b"connection", b"").lower()
        coding = headers.get(b"transfer-encoding", b"").lower()
        length = headers.get(b"content-length")
        if status in _NO_BODY:
            body = b""
        elif coding:
            if coding != b"chunked" or length is not None:
                raise WireError("an answer framed in a way this client does not read")
            body = await self._chunks()
        elif length is not None:
            if not length.isdigit():
                raise WireError("a malformed content-length in the answer")
            body = await self._exactly(int(length))
        else:  # framed by the end of the connection
            parts = [bytes(self._buffer)]
            self._buffer.clear()
            while await self._more():
                parts.append(bytes(self._buffer))
                self._buffer.clear()
            return Answer(status, b"".join(parts), keep=False)
        return Answer(status, body, keep)

    async def _chunks(self) -> bytes:
        parts: list[bytes] = []
        while True:
            size = await self._line(1024)
            digits = size.split(b";", 1)[0].strip()
            if not digits or any(c not in b"0123456789abcdefABCDEF" for c in digits):
                raise WireError("a malformed chunk size in the answer")
            if not (count := int(digits, 16)):
                while await self._line(_MAX_HEAD):  # the trailer, to its empty line
                    pass
                return b"".join(parts)
            parts.append(await self._exactly(count))
            if await self._line(2):
                raise WireError("a chunk longer than its size in the answer")
