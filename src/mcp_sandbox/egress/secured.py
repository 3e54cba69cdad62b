"""A connection to a host with a secret: the sandbox's TLS ended, the proxy's own to the host kept or opened.

:class:`~.proxy.EgressProxy` hands a ``CONNECT`` to a host a secret of the run goes to here,
after its rules allowed the name. The proxy's own TLS connection to the host is one kept from an
earlier connection of the same tenant with the same secrets (:mod:`.pool`), if one is quiet and
its address is allowed by this run's rules; else a new one (to a checked address, verified,
:mod:`.terminate`). The requests are served by :func:`~.intercept.serve_intercepted` within the
run's caps, and the connection is kept afterwards when it says that it may carry another.
"""

from __future__ import annotations

import builtins
import contextlib
import ipaddress
import ssl
from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol

import anyio
from anyio.abc import ByteStream, SocketStream
from anyio.streams.buffered import BufferedByteReceiveStream
from anyio.streams.tls import TLSStream

from mcp_sandbox.egress.addresses import IPAddress
from mcp_sandbox.egress.audit import Connection
from mcp_sandbox.egress.heads import Refused, answer
from mcp_sandbox.egress.intercept import Reopen, Stopped, serve_intercepted
from mcp_sandbox.egress.pool import PoolKey
from mcp_sandbox.egress.rules import EgressGrant, Refusal
from mcp_sandbox.egress.secrets import BoundSecret
from mcp_sandbox.egress.terminate import SessionKey, handshakes, open_upstream, sandbox_tls
from mcp_sandbox.egress.tls import Replay

if TYPE_CHECKING:
    from mcp_sandbox.egress.authority import Authority

__all__ = ["Proxy", "serve_secured"]

_HELLO_TIMEOUT = 15.0
_MAX_REQUEST_HEAD = 64 << 10


class Proxy(Protocol):
    """What of the run's proxy a secret's connection uses: its grant, its byte count, its checked connecting."""

    grant: EgressGrant
    bytes: int

    async def connect(self, c: Connection) -> SocketStream:
        """Connect to a checked address of ``c.host`` (raises Refused)."""

    async def client_hello(self, reader: BufferedByteReceiveStream, c: Connection) -> builtins.bytes | None:
        """The tunnel's ClientHello, if it names ``c.host``."""

    def refusal(self, address: IPAddress, c: Connection) -> Refusal | None:
        """Why the run may not connect to ``address`` (None: it may)."""


async def serve_secured(
    proxy: Proxy,
    authority: Authority,
    client: SocketStream,
    reader: BufferedByteReceiveStream,
    c: Connection,
    applied: Sequence[BoundSecret],
) -> None:
    """Serve ``c`` (a ``CONNECT`` whose name the rules allowed) to a host ``applied`` secrets go to.

    Raises:
        Refused: no kept connection, and no address of the host was allowed or answered.
    """
    c.secrets = tuple(secret.name for secret in applied)
    key: PoolKey = (proxy.grant.tenant, c.host, c.port, frozenset(c.secrets))
    sessions: SessionKey = key[:3]
    idle = await authority.pool.take(key, lambda at: proxy.refusal(ipaddress.ip_address(at), c) is None)
    opened: list[ByteStream] = [idle.stream] if idle is not None else [await proxy.connect(c)]
    if idle is not None:
        c.address = idle.address
    context = authority.upstream_context()
    kept: ByteStream | None = None

    async def reopen() -> ByteStream:
        try:
            opened.append(await proxy.connect(c))
        except Refused as refused:
            raise Stopped("cut", refused.refusal.rule, refused.refusal.message) from None
        try:
            with anyio.fail_after(_HELLO_TIMEOUT):
                opened.append(await open_upstream(opened[-1], c.host, context, authority.sessions.get(sessions)))
        except (OSError, TimeoutError, anyio.EndOfStream, anyio.BrokenResourceError):  # ssl.SSLError too
            raise Stopped("cut", "upstream_closed", "the host's TLS failed") from None
        return opened[-1]

    try:
        await client.send(b"HTTP/1.1 200 Connection established\r\n\r\n")
        hello = await proxy.client_hello(reader, c)
        if hello is None:
            return
        inner = Replay(reader, client, hello)
        try:
            leaf = authority.server_context(c.host)
        except OSError:  # no memory file could hold the leaf
            c.rule = "tls_handshake"
            return
        sandbox, origin = await _handshakes(inner, leaf, opened[0], c.host, context, authority.sessions.get(sessions))
        if sandbox is None:
            c.rule = "tls_handshake"  # the code did not trust the CA, or spoke no TLS
            return
        if origin is None:
            c.rule = "upstream_certificate"
            untrusted = Refused(Refusal(c.rule, "the host's certificate is not trusted"), 502)
            await _request_head(sandbox)
            await answer(sandbox, untrusted, c.host, c.port)
            return
        if origin is not opened[0]:
            opened.append(origin)
        kept = await _serve(proxy, sandbox, origin, c, reopen if idle is not None else None)
        if idle is None:
            authority.sessions.keep(sessions, origin)
    finally:
        for stream in reversed(opened):  # a TLS stream before its socket
            if kept is None or (stream is not kept and stream is not getattr(kept, "transport_stream", None)):
                with anyio.CancelScope(shield=True), contextlib.suppress(OSError, anyio.BrokenResourceError):
                    await stream.aclose()
        if isinstance(kept, TLSStream) and c.address is not None:
            await authority.pool.put(key, kept, c.address)


async def _handshakes(
    inner: ByteStream,
    leaf: ssl.SSLContext,
    upstream: ByteStream,
    host: str,
    context: ssl.SSLContext,
    session: ssl.SSLSession | None,
) -> tuple[TLSStream | None, TLSStream | None]:
    """Both handshakes, or the sandbox's alone when ``upstream`` is a kept TLS connection (returned as it is)."""
    if isinstance(upstream, TLSStream):
        return await sandbox_tls(inner, leaf, _HELLO_TIMEOUT), upstream
    return await handshakes(inner, leaf, upstream, host, context, session, _HELLO_TIMEOUT)


async def _request_head(sandbox: ByteStream) -> None:
    """Read the head of the request an answer refuses (bounded in size and time) before answering.

    Answered and closed at once, a client still sending its request would meet a closed
    connection (a broken pipe, an EOF in TLS) instead of the answer that says why.
    """
    reader = BufferedByteReceiveStream(sandbox)
    with (
        anyio.move_on_after(_HELLO_TIMEOUT),
        contextlib.suppress(
            anyio.EndOfStream, anyio.IncompleteRead, anyio.DelimiterNotFound, anyio.BrokenResourceError, OSError
        ),
    ):
        await reader.receive_until(b"\r\n\r\n", _MAX_REQUEST_HEAD)


async def _serve(
    proxy: Proxy, sandbox: ByteStream, origin: ByteStream, c: Connection, reopen: Reopen | None
) -> ByteStream | None:
    """Serve the requests within the run's caps; the connection to the host to keep, if any."""

    def meter(size: int, outbound: bool) -> bool:
        if proxy.bytes + size > proxy.grant.max_bytes:
            return False
        proxy.bytes += size
        if outbound:
            c.sent += size
        else:
            c.received += size
        return True

    c.verdict, c.rule = "allowed", "secret"
    kept: ByteStream | None = None
    with anyio.move_on_after(proxy.grant.connection_timeout) as scope:
        try:
            kept = await serve_intercepted(sandbox, origin, c.host, proxy.grant.secrets, meter, reopen)
        except Stopped as stopped:
            c.verdict, c.rule = stopped.verdict, stopped.rule  # type: ignore[assignment]
    if scope.cancelled_caught:
        kept = None
        if c.verdict == "allowed":
            c.verdict, c.rule = "cut", "egress_connection_timeout"
    return kept
