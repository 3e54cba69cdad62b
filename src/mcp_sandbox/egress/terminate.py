"""Both TLS handshakes of a connection to a secret's host, at once: the sandbox's ended, the proxy's own opened.

The sandbox's handshake (with a leaf of :class:`~.authority.Authority`) and the proxy's own to the
host (verified against the host's roots and ``egress_upstream_ca``) run side by side, so the
first request waits for the slower of the two, not their sum (or is a kept one, :mod:`.pool`, and
only the sandbox's runs: :func:`sandbox_tls`). The proxy's own resumes the TLS
session of its last connection to the same host for the same tenant (:class:`Sessions`): a
resumed handshake skips the certificate checks and most of the key exchange's work.

anyio's ``TLSStream.wrap`` takes no session, and given a subclassed ``SSLContext`` it calls
``wrap_bio`` in a worker thread; the upstream's stream is therefore built from ``TLSStream``'s
own fields and its handshake driven by its own method (anyio 4), in the event loop.
"""

from __future__ import annotations

import collections
import ssl

import anyio
from anyio.abc import ByteStream
from anyio.streams.tls import TLSAttribute, TLSStream

__all__ = ["SessionKey", "Sessions", "handshakes", "open_upstream", "sandbox_tls"]

SessionKey = tuple[str, str, int]  # tenant, host, port
_FAILED = (ssl.SSLError, TimeoutError, anyio.EndOfStream, anyio.BrokenResourceError, OSError)


class Sessions:
    """The last TLS session per (tenant, host, port) toward upstreams; at most ``size``, the oldest dropped.

    Per tenant: another tenant's connection would otherwise be faster after one's, telling it
    that the host was used.
    """

    def __init__(self, size: int = 512) -> None:
        """Keep at most ``size`` sessions."""
        self._size = size
        self._kept: collections.OrderedDict[SessionKey, ssl.SSLSession] = collections.OrderedDict()

    def get(self, key: SessionKey) -> ssl.SSLSession | None:
        """The session to resume toward ``key``'s host, if one is kept."""
        return self._kept.get(key)

    def keep(self, key: SessionKey, stream: TLSStream) -> None:
        """Keep the session of ``stream`` (a finished connection to ``key``'s host), unless it resumed a kept one.

        A resumed session is kept as it was: Python copies a session each way it crosses (a
        fifth of a millisecond), and OpenSSL offers no ticket once it has expired, so the next
        full handshake replaces it.
        """
        ssl_object = stream.extra(TLSAttribute.ssl_object)
        if ssl_object.session_reused and key in self._kept:
            return
        session = ssl_object.session
        if session is None or not (session.has_ticket or session.id):
            return
        self._kept[key] = session
        self._kept.move_to_end(key)
        while len(self._kept) > self._size:
            self._kept.popitem(last=False)


async def open_upstream(
    upstream: ByteStream, host: str, context: ssl.SSLContext, session: ssl.SSLSession | None
) -> TLSStream:
    """The proxy's own TLS to ``host`` over ``upstream`` (``context`` verifying it, resuming ``session``).

    Raises:
        ssl.SSLError, OSError, anyio.EndOfStream, anyio.BrokenResourceError: the handshake failed.
    """
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    ssl_object = context.wrap_bio(incoming, outgoing, server_hostname=host, session=session)
    stream = TLSStream(
        transport_stream=upstream,
        standard_compatible=False,
        _ssl_object=ssl_object,
        _read_bio=incoming,
        _write_bio=outgoing,
    )
    await stream._call_sslobject_method(ssl_object.do_handshake)
    return stream


async def handshakes(
    sandbox: ByteStream,
    leaf: ssl.SSLContext,
    upstream: ByteStream,
    host: str,
    context: ssl.SSLContext,
    session: ssl.SSLSession | None,
    limit: float,
) -> tuple[TLSStream | None, TLSStream | None]:
    """The sandbox's TLS (``leaf`` presented) and the proxy's own to ``host`` (``context``, resuming ``session``).

    Either is None where its handshake failed or took longer than ``limit`` seconds; the
    upstream's is not waited for when the sandbox's failed.
    """
    ended: list[TLSStream] = []
    opened: list[TLSStream] = []

    async def upstream_side() -> None:
        try:
            with anyio.fail_after(limit):
                opened.append(await open_upstream(upstream, host, context, session))
        except _FAILED:
            pass

    async with anyio.create_task_group() as group:
        group.start_soon(upstream_side)
        try:
            with anyio.fail_after(limit):
                wrapped = TLSStream.wrap(sandbox, server_side=True, ssl_context=leaf, standard_compatible=False)
                ended.append(await wrapped)
        except _FAILED:
            group.cancel_scope.cancel()
    return (ended[0] if ended else None), (opened[0] if opened else None)


async def sandbox_tls(sandbox: ByteStream, leaf: ssl.SSLContext, limit: float) -> TLSStream | None:
    """The sandbox's TLS alone (``leaf`` presented; the proxy's own to the host is a kept one); None if it failed."""
    try:
        with anyio.fail_after(limit):
            return await TLSStream.wrap(sandbox, server_side=True, ssl_context=leaf, standard_compatible=False)
    except _FAILED:
        return None
