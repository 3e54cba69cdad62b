"""Requests to a host with a secret: HTTP/1.1 read between the sandbox's TLS and the proxy's own, the secret applied.

For each request on the connection (keep-alive is kept), the proxy refuses one that carries the
placeholder of a secret that may not go to this host (403, rule ``secret_placeholder``) or names
another host (``Host``, or an absolute target: 403, rule ``secret_host``), sets
each secret's header from its template, replaces the placeholder in every header value with the
real value, asks for an uncompressed answer (``Accept-Encoding: identity``, so echoes can be
found), and passes the answer back with every echo of a real value replaced by the placeholder
(head and body; the body re-framed as chunked, since the lengths change). A ``101`` (WebSocket)
answer leaves the rest of the connection copied as it is, unscrubbed. The two legs' persistence
is decided apart: the sandbox's hop-by-hop headers (``Connection`` and those it names,
``Keep-Alive``, ``TE``, ``Proxy-*``) are not sent on, so the proxy's connection to the host
outlives a one-shot client's, and :func:`serve_intercepted` says whether it may carry another
request (:mod:`.pool`): HTTP/1.1 both ways, no ``Connection: close`` from the host, its last
answer read to the end of its framing (a length or chunks; or none, for ``HEAD``, 1xx, 204 and
304), nothing more received. The request line, headers
and bodies are parsed here by hand: a few framing rules of RFC 9112 are all a proxy needs, and
an HTTP library would own the connection.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence

import anyio
from anyio.abc import ByteStream
from anyio.streams.buffered import BufferedByteReceiveStream

from mcp_sandbox.egress.secrets import BoundSecret, Scrubber, foreign_placeholder

__all__ = ["Meter", "Stopped", "serve_intercepted"]

_MAX_HEAD = 64 << 10
_MAX_CHUNK_LINE = 4096
_CHUNK = 64 << 10
_NO_BODY = frozenset({204, 304})
_HOP = frozenset({"connection", "keep-alive", "proxy-connection", "proxy-authorization", "te", "upgrade"})
_CONTROL = re.compile("[\x00-\x08\x0a-\x1f\x7f]")  # a tab is allowed in a header line

# Counts ``size`` bytes going out (True) or in; False when the run's byte cap would be passed.
Meter = Callable[[int, bool], bool]
# A new connection to the host, for a request a kept one turned out closed for (raises Stopped if none).
Reopen = Callable[[], Awaitable[ByteStream]]


class Stopped(Exception):
    """The connection ends early: ``verdict`` and ``rule`` say why (for the audit line)."""

    def __init__(self, verdict: str, rule: str, message: str = "") -> None:
        super().__init__(message or rule)
        self.verdict, self.rule, self.message = verdict, rule, message


Headers = list[tuple[str, str]]


def _parse(head: bytes) -> tuple[str, Headers]:
    lines = head.decode("latin-1").split("\r\n")
    headers: Headers = []
    for line in lines[1:]:
        if not line:
            continue
        name, colon, value = line.partition(":")
        if not colon or not name or name != name.strip() or line[0] in " \t":
            raise Stopped("refused", "request", "a malformed header line")
        if _CONTROL.search(line):
            raise Stopped("refused", "request", "a header holds a control character")
        headers.append((name, value.strip()))
    return lines[0], headers


def _render(first: str, headers: Headers) -> bytes:
    return "\r\n".join([first, *(f"{name}: {value}" for name, value in headers), "", ""]).encode("latin-1")


def _get(headers: Headers, name: str) -> str | None:
    values = [value for key, value in headers if key.lower() == name]
    return ", ".join(values) if values else None


def _hostname(value: str) -> str:
    """The host of a ``Host`` header's value, lower case, without its port or a trailing dot."""
    value = value.strip().lower()
    if value.startswith("["):
        return value[1 : value.find("]")] if "]" in value else value
    return value.rpartition(":")[0].removesuffix(".") if ":" in value else value.removesuffix(".")


def _length(headers: Headers) -> int | None:
    given = _get(headers, "content-length")
    if given is None:
        return None
    if not given.isdigit():
        raise Stopped("refused", "request", "Content-Length is not a number")
    return int(given)


def _chunked(headers: Headers) -> bool:
    coding = _get(headers, "transfer-encoding")
    if coding is None:
        return False
    if coding.lower().replace(" ", "").split(",")[-1] != "chunked":
        raise Stopped("refused", "request", "a transfer coding other than chunked")
    return True


class _Side:
    """One leg of the connection, in the clear: reads counted against the run's caps."""

    def __init__(self, stream: ByteStream, meter: Meter, outbound: bool) -> None:
        self.stream = stream
        self.reader = BufferedByteReceiveStream(stream)
        self.meter, self._outbound = meter, outbound

    def _count(self, data: bytes) -> bytes:
        if not self.meter(len(data), self._outbound):
            raise Stopped("cut", "egress_max_bytes")
        return data

    async def head(self) -> bytes | None:
        try:
            return self._count(await self.reader.receive_until(b"\r\n\r\n", _MAX_HEAD) + b"\r\n\r\n")
        except (anyio.EndOfStream, anyio.IncompleteRead):
            return None
        except anyio.DelimiterNotFound:
            raise Stopped("refused", "request", "a head longer than the proxy reads") from None

    async def body(self, headers: Headers, *, until_close: bool) -> AsyncIterator[bytes]:
        """The body's bytes, decoded from its framing (chunked, a length, or until the end)."""
        if _chunked(headers):
            while True:
                line = await self.reader.receive_until(b"\r\n", _MAX_CHUNK_LINE)
                size_text = line.split(b";")[0].strip()
                try:
                    size = int(size_text, 16)
                except ValueError:
                    raise Stopped("refused", "request", "a malformed chunk") from None
                if size == 0:
                    while await self.reader.receive_until(b"\r\n", _MAX_CHUNK_LINE):
                        pass  # trailers, dropped
                    return
                while size:
                    piece = self._count(await self.reader.receive(min(size, _CHUNK)))
                    size -= len(piece)
                    yield piece
                await self.reader.receive_exactly(2)
        length = _length(headers)
        if length is not None:
            while length:
                piece = self._count(await self.reader.receive(min(length, _CHUNK)))
                length -= len(piece)
                yield piece
        elif until_close:
            with contextlib.suppress(anyio.EndOfStream):
                while True:
                    yield self._count(await self.reader.receive(_CHUNK))


async def _refuse(client: ByteStream, status: int, rule: str, message: str) -> None:
    reason = {400: "Bad Request", 403: "Forbidden", 502: "Bad Gateway"}.get(status, "Error")
    body = f"mcp-sandbox egress proxy refused this request: {message} (rule: {rule})\n".encode()
    head = (
        f"HTTP/1.1 {status} {reason}\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: {len(body)}\r\n"
        f"X-Egress-Rule: {rule}\r\nConnection: close\r\n\r\n"
    )
    with contextlib.suppress(OSError, anyio.BrokenResourceError, anyio.ClosedResourceError):
        await client.send(head.encode() + body)


async def serve_intercepted(
    client: ByteStream,
    upstream: ByteStream,
    host: str,
    bound: Sequence[BoundSecret],
    meter: Meter,
    reopen: Reopen | None = None,
) -> ByteStream | None:
    """Serve the requests of one connection to ``host`` (both legs in the clear) until either side ends.

    ``bound``: every secret of the run (those not applying to ``host`` are refused if seen).
    ``reopen``: given when ``upstream`` is a kept connection: a first request without a body
    that finds it closed (nothing answered) is sent again on the connection ``reopen`` opens.

    Returns:
        The connection to the host (``upstream`` or the reopened one) if it may carry another
        request (see the module), else None.

    Raises:
        Stopped: a request was refused (answered first) or the run's byte cap was reached.
    """
    applied = tuple(secret for secret in bound if secret.applies_to(host))
    sandbox, origin = _Side(client, meter, True), _Side(upstream, meter, False)
    reusable = True
    try:
        while True:
            done = await _exchange(sandbox, origin, host, bound, applied, reopen)
            if done is None:
                break
            origin, more, clean = done
            reusable, reopen = reusable and clean, None
            if not more:
                break
    except Stopped as stopped:
        if stopped.verdict == "refused":
            await _refuse(client, 403 if stopped.rule.startswith("secret") else 400, stopped.rule, stopped.message)
        raise
    return origin.stream if reusable and not origin.reader.buffer else None


async def _exchange(
    sandbox: _Side,
    origin: _Side,
    host: str,
    bound: Sequence[BoundSecret],
    applied: Sequence[BoundSecret],
    reopen: Reopen | None,
) -> tuple[_Side, bool, bool] | None:
    """One request and its answer (None: the sandbox sent none): the host's leg, whether each leg may carry another."""
    head = await sandbox.head()
    if head is None:
        return None
    foreign = foreign_placeholder(bound, host, head)
    if foreign is not None:
        raise Stopped("refused", "secret_placeholder", f"secret {foreign.name!r} may not go to {host}")
    first, headers = _parse(head)
    parts = first.split(" ")
    if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
        raise Stopped("refused", "request", "not an HTTP/1 request")
    method, target, version = parts
    named = [value for name, value in headers if name.lower() == "host"]
    if not target.startswith("/") or len(named) != 1 or _hostname(named[0]) != host:
        # Behind one address (a CDN) another Host would be another site: the secret goes to this one only.
        raise Stopped("refused", "secret_host", f"a request through {host}'s tunnel must name {host} alone")
    chunked, length = _chunked(headers), _length(headers)
    if chunked and length is not None:  # two framings: a request smuggled in the body
        raise Stopped("refused", "request", "both Content-Length and Transfer-Encoding")
    tokens = {token.strip().lower() for token in (_get(headers, "connection") or "").split(",")}
    upgrade = "upgrade" in tokens and _get(headers, "upgrade") is not None
    replaced = {secret.spec.header.lower() for secret in applied} | {"accept-encoding", "expect"}
    replaced |= (_HOP | tokens) - ({"host", "upgrade"} if upgrade else {"host"})
    sent: Headers = []
    for name, value in headers:
        if name.lower() in replaced:
            continue
        for secret in applied:
            value = value.replace(secret.placeholder, secret.spec.value.reveal())
        sent.append((name, value))
    sent += [(secret.spec.header, secret.spec.header_value()) for secret in applied]
    sent.append(("Accept-Encoding", "identity"))
    if upgrade:
        sent.append(("Connection", "Upgrade"))
    request = _render(first, sent)
    answered: bytes | None = None
    if reopen is not None and not chunked and not length:
        answered = await _first_head(origin, request)
        if answered is None:  # the kept connection was closed by the host: once more on a new one
            origin = _Side(await reopen(), origin.meter, False)
            answered = await _first_head(origin, request)
            if answered is None:
                raise Stopped("cut", "upstream_closed", "the host closed the connection without an answer")
    else:
        await origin.stream.send(request)
        if (_get(headers, "expect") or "").lower() == "100-continue":
            await sandbox.stream.send(b"HTTP/1.1 100 Continue\r\n\r\n")
        async for piece in sandbox.body(headers, until_close=False):
            await origin.stream.send(b"%x\r\n%s\r\n" % (len(piece), piece) if chunked else piece)
        if chunked:
            await origin.stream.send(b"0\r\n\r\n")
    more, clean = await _answer(sandbox, origin, method, version, headers, applied, answered)
    return origin, more, clean and version == "HTTP/1.1" and not upgrade


async def _first_head(origin: _Side, request: bytes) -> bytes | None:
    """Send ``request`` (no body) and read its answer's head; None if the connection was closed first."""
    try:
        await origin.stream.send(request)
        return await origin.head()
    except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):  # ssl.SSLError is an OSError
        return None


async def _answer(
    sandbox: _Side,
    origin: _Side,
    method: str,
    version: str,
    asked: Headers,
    applied: Sequence[BoundSecret],
    head: bytes | None,
) -> tuple[bool, bool]:
    """Pass the answer on (``head``: its head, if already read); whether the sandbox's and the host's legs go on."""
    scrubber = Scrubber(applied)
    while True:
        if head is None:
            head = await origin.head()
        if head is None:
            raise Stopped("cut", "upstream_closed", "the host closed the connection without an answer")
        first, headers = _parse(head)
        parts = first.split(" ", 2)
        if len(parts) < 2 or not parts[1].isdigit():
            raise Stopped("cut", "upstream_response", "the host's answer is not HTTP/1")
        status = int(parts[1])
        if 100 <= status < 200 and status != 101:
            await sandbox.stream.send(scrubber.scrub(head))
            head = None
            continue
        break
    if status == 101:  # a protocol switch (WebSocket): copied as it is from here on
        await sandbox.stream.send(scrubber.scrub(head))
        await _copy_both(sandbox, origin)
        return False, False
    bodiless = method == "HEAD" or status in _NO_BODY
    chunked, length = _chunked(headers), _length(headers)
    framed = chunked or length is not None
    closes = "close" in (_get(headers, "connection") or "").lower()
    closing = closes or "close" in (_get(asked, "connection") or "").lower()
    keep = version == "HTTP/1.1" and not closing and (framed or bodiless)
    # The host's leg: an HTTP/1.1 answer that ends where its framing says (two framings: ambiguous).
    clean = parts[0] == "HTTP/1.1" and not closes and (bodiless or framed) and not (chunked and length is not None)
    kept = [(n, v) for n, v in headers if n.lower() not in ("content-length", "transfer-encoding", "connection")]
    if not bodiless:
        kept.append(("Transfer-Encoding", "chunked") if version == "HTTP/1.1" else ("Connection", "close"))
    if not keep and version == "HTTP/1.1":
        kept.append(("Connection", "close"))
    await sandbox.stream.send(scrubber.scrub(_render(first, kept)))
    if bodiless:
        return keep, clean
    chunk = version == "HTTP/1.1"
    async for piece in origin.body(headers, until_close=True):
        out = scrubber.feed(piece)
        if out:
            await sandbox.stream.send(b"%x\r\n%s\r\n" % (len(out), out) if chunk else out)
    rest = scrubber.flush()
    if rest:
        await sandbox.stream.send(b"%x\r\n%s\r\n" % (len(rest), rest) if chunk else rest)
    if chunk:
        await sandbox.stream.send(b"0\r\n\r\n")
    return keep, clean


async def _copy_both(sandbox: _Side, origin: _Side) -> None:
    async def copy(source: _Side, sink: ByteStream, group: anyio.abc.TaskGroup) -> None:
        with contextlib.suppress(anyio.EndOfStream, anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
            while True:
                await sink.send(source._count(await source.reader.receive(_CHUNK)))
        group.cancel_scope.cancel()

    async with anyio.create_task_group() as group:
        group.start_soon(copy, sandbox, origin.stream, group)
        group.start_soon(copy, origin, sandbox.stream, group)
