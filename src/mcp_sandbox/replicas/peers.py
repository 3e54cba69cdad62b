"""The internal hop's HTTP/1.1 client: one POST to another replica, on a kept-alive connection.

Its own wire (:mod:`.hop_http`) on anyio's TCP streams rather than httpx2, httpcore2 or h11: the hop
posts one JSON body to a known peer and reads one answer, and the general clients' layers (URL
and header models, auth and redirect steps, the pool's locks and events, h11's event machinery)
cost more CPU than the round trip itself (docs/performance.md, forwarding between replicas).
What they do that matters here is kept: connections are pooled per peer; an idle one is reused
only while younger than ``idle`` (less than the peer's keep-alive, so the peer does not close it
under a request) and not closed by the peer meanwhile (a readable idle socket is closed or
broken); a large body is sent in chunks; https peers get httpx2's TLS context, or one trusting
only ``replica_ca`` when it is set, and this replica's certificate (``internal_cert``) for a peer
that asks for one (mutual TLS). A request that
fails once sent is not retried: the peer may have run it (:class:`Broken`).
"""

from __future__ import annotations

import select
import socket
import ssl
import time
import urllib.parse
from dataclasses import dataclass
from pathlib import Path

import anyio
import anyio.abc

from mcp_sandbox.errors import ConfigError
from mcp_sandbox.replicas.hop_http import Reader, WireError, request_head

__all__ = ["Broken", "PeerError", "Peers", "Reply", "Unreachable"]

_CHUNK = 1 << 16


class PeerError(Exception):
    """The peer did not answer the request."""


class Unreachable(PeerError):
    """The peer refused the connection or could not be reached: nothing was sent."""


class Broken(PeerError):
    """The request was sent (perhaps in part) and no whole answer came back: it may have run."""


@dataclass(frozen=True)
class Reply:
    status: int
    body: bytes


@dataclass
class _Connection:
    stream: anyio.abc.ByteStream
    reader: Reader
    sock: socket.socket  # looked up once: anyio's extra() builds its table of attributes on every call
    idle_since: float = 0.0
    keep: bool = False  # the last answer came whole and allows another request

    def reusable(self, now: float, idle: float) -> bool:
        """Idle for less than ``idle`` and not closed by the peer (nothing may arrive between answers)."""
        if now - self.idle_since >= idle:
            return False
        if self.sock.fileno() < 0:
            return False
        poll = select.poll()
        poll.register(self.sock, select.POLLIN)
        return not poll.poll(0)


class Peers:
    """Kept-alive HTTP/1.1 connections to other replicas, at most ``keep`` idle per peer."""

    def __init__(
        self,
        connect_timeout: float,
        read_timeout: float,
        idle: float,
        keep: int = 32,
        ca: Path | None = None,
        identity: tuple[Path, Path] | None = None,
    ) -> None:
        self._connect_timeout = connect_timeout
        self._read_timeout = read_timeout
        self._idle = idle
        self._keep = keep
        self._pools: dict[tuple[str, str, int], list[_Connection]] = {}
        self._tls: ssl.SSLContext | None = None
        if ca is not None:  # an internal CA: only it vouches for the replicas (read now: a bad file stops the start)
            try:
                self._tls = ssl.create_default_context(cafile=ca)
            except (OSError, ssl.SSLError) as exc:
                raise ConfigError(f"replica_ca: {ca} is not a readable PEM file of CA certificates ({exc})") from exc
        if identity is not None:  # presented to a peer that asks (mutual TLS)
            certificate, key = identity
            try:
                self._tls_context().load_cert_chain(certificate, key)
            except (OSError, ssl.SSLError) as exc:
                raise ConfigError(
                    f"internal_cert, internal_key: {certificate} and {key} are not a PEM certificate"
                    f" and its key ({exc})"
                ) from exc
        self._closed = False

    async def post(self, url: str, body: bytes, headers: list[tuple[str, str]]) -> Reply:
        """POST ``body`` to ``url`` (``http://`` or ``https://``); the answer, whatever its status.

        Raises:
            Unreachable: no connection (nothing sent). Broken: no whole answer, or the read timed out.
        """
        parts = urllib.parse.urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise Unreachable(f"not an http(s) URL: {url!r}")
        origin = (parts.scheme, parts.hostname, parts.port or (443 if parts.scheme == "https" else 80))
        target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        connection = await self._pooled(origin)
        if connection is None:
            connection = await self._connect(origin)
        try:
            reply = await self._exchange(connection, parts.netloc, target, body, headers)
        except BaseException:
            with anyio.CancelScope(shield=True):
                await anyio.aclose_forcefully(connection.stream)
            raise
        await self._give_back(origin, connection)
        return reply

    async def _pooled(self, origin: tuple[str, str, int]) -> _Connection | None:
        pool = self._pools.get(origin, [])
        now = time.monotonic()
        while pool:
            connection = pool.pop()  # the most recently used first: the least likely to have expired
            if connection.reusable(now, self._idle):
                return connection
            await anyio.aclose_forcefully(connection.stream)
        return None

    async def _connect(self, origin: tuple[str, str, int]) -> _Connection:
        scheme, host, port = origin
        try:
            with anyio.fail_after(self._connect_timeout):
                if scheme == "https":
                    stream: anyio.abc.ByteStream = await anyio.connect_tcp(
                        host, port, tls=True, ssl_context=self._tls_context(), tls_hostname=host
                    )
                else:
                    stream = await anyio.connect_tcp(host, port)
        except (OSError, TimeoutError) as exc:
            raise Unreachable(f"{host}:{port}: {exc or type(exc).__name__}") from exc
        return _Connection(stream, Reader(stream), stream.extra(anyio.abc.SocketAttribute.raw_socket))

    def _tls_context(self) -> ssl.SSLContext:
        if self._tls is None:
            import httpx2

            self._tls = httpx2.create_ssl_context(trust_env=False)
        return self._tls

    async def _exchange(
        self, connection: _Connection, host: str, target: str, body: bytes, headers: list[tuple[str, str]]
    ) -> Reply:
        stream = connection.stream
        connection.keep = False
        try:
            head = request_head(host, target, len(body), headers)
        except ValueError as exc:
            raise Unreachable(str(exc)) from exc
        try:
            # One deadline for the exchange: the answer starts once the call has run, then comes at once.
            with anyio.fail_after(self._read_timeout):
                if len(body) <= _CHUNK:
                    await stream.send(head + body)  # one write: one segment, one wake-up of the peer
                else:  # a forwarded upload: in chunks, never copied whole
                    await stream.send(head)
                    view = memoryview(body)
                    for offset in range(0, len(body), _CHUNK):
                        await stream.send(bytes(view[offset : offset + _CHUNK]))
                answer = await connection.reader.answer()
        except (OSError, TimeoutError, WireError, anyio.BrokenResourceError, anyio.ClosedResourceError) as exc:
            raise Broken(str(exc) or type(exc).__name__) from exc
        connection.keep = answer.keep and not connection.reader.pending
        return Reply(answer.status, answer.body)

    async def _give_back(self, origin: tuple[str, str, int], connection: _Connection) -> None:
        pool = self._pools.setdefault(origin, [])
        if self._closed or not connection.keep or len(pool) >= self._keep:
            await anyio.aclose_forcefully(connection.stream)
            return
        connection.idle_since = time.monotonic()
        pool.append(connection)

    async def aclose(self) -> None:
        """Close the idle connections; one in use is closed when its request ends."""
        self._closed = True
        pools, self._pools = self._pools, {}
        for pool in pools.values():
            for connection in pool:
                await anyio.aclose_forcefully(connection.stream)
