"""The proxy's idle TLS connections to a secret's hosts, kept for the next sandbox connection of the same tenant.

A sandbox client that opens a new connection per request (urllib, curl, most one-shot scripts)
would otherwise cost the proxy a TLS handshake with the host every time. A connection is kept
(:meth:`Pool.put`) only when :func:`~.intercept.serve_intercepted` says its last answer was read
to its framing's end, and taken (:meth:`Pool.take`) only by a connection with the same key: the
tenant, the host, the port and the names of the secrets applied. Never across tenants: another
tenant would otherwise be answered faster after one's, learning that the host was used, and
would send its requests on a connection the first tenant's secret may have authenticated (some
servers bind an authentication to the connection). At most :data:`PER_KEY` per key and
:data:`SIZE` in all (the longest idle closed first), each for :data:`IDLE` seconds; before
reuse a connection must be quiet: nothing buffered, nothing to read on its socket (a peer's
end, a TLS alert, stray bytes all drop it). The standard library's HTTP pools own their
connections' reading (an HTTP client's), so none fits a proxy that frames the bytes itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import select
import time
from collections.abc import Callable
from dataclasses import dataclass

import anyio
from anyio.abc import SocketAttribute
from anyio.streams.tls import TLSAttribute, TLSStream

__all__ = ["IDLE", "PER_KEY", "SIZE", "Idle", "Pool", "PoolKey", "quiet"]

PoolKey = tuple[str, str, int, frozenset[str]]  # tenant, host, port, the secrets applied
PER_KEY = 8
SIZE = 128
IDLE = 4.0


@dataclass(slots=True)
class Idle:
    """A kept connection: its TLS stream, the address it connects to, since when it is idle, its event loop."""

    stream: TLSStream
    address: str
    since: float
    loop: asyncio.AbstractEventLoop


def quiet(stream: TLSStream) -> bool:
    """Whether ``stream`` is open with nothing received and unread: at an answer's end, its peer silent."""
    ssl_object = stream.extra(TLSAttribute.ssl_object)
    if ssl_object.pending() or stream._read_bio.pending:
        return False
    protocol = getattr(stream.transport_stream, "_protocol", None)  # anyio's asyncio stream: its read queue
    if protocol is None or getattr(protocol, "read_queue", True) or getattr(protocol, "is_at_eof", True):
        return False
    try:
        poll = select.poll()
        poll.register(stream.extra(SocketAttribute.raw_socket).fileno(), select.POLLIN | select.POLLRDHUP)
        return not poll.poll(0)  # readable: the peer's end, an error, or bytes nobody asked for
    except (OSError, ValueError):  # closed
        return False


class Pool:
    """Idle connections per :data:`PoolKey`, newest first; those of the running event loop only are handed out."""

    def __init__(
        self, per_key: int = PER_KEY, size: int = SIZE, idle: float = IDLE, clock: Callable[[], float] = time.monotonic
    ) -> None:
        """Keep at most ``per_key`` per key and ``size`` in all, each at most ``idle`` seconds."""
        self._per_key, self._size, self._idle, self._clock = per_key, size, idle, clock
        self._kept: dict[PoolKey, list[Idle]] = {}

    def __len__(self) -> int:
        return sum(len(kept) for kept in self._kept.values())

    async def take(self, key: PoolKey, allowed: Callable[[str], bool]) -> Idle | None:
        """A quiet connection of ``key`` whose address ``allowed`` accepts (the run's rules), or None.

        Those expired, not quiet or refused are closed on the way (the lists change before any wait).
        """
        dropped = self._expired()
        loop, found = asyncio.get_running_loop(), None
        kept = self._kept.get(key, [])
        for idle in reversed(list(kept)):
            if idle.loop is not loop:
                continue
            kept.remove(idle)
            if quiet(idle.stream) and allowed(idle.address):
                found = idle
                break
            dropped.append(idle)
        self._tidy(key)
        await self._close_all(dropped)
        return found

    async def put(self, key: PoolKey, stream: TLSStream, address: str) -> None:
        """Keep ``stream`` (an answer read to its end, the connection quiet) for ``key``, or close it."""
        if not quiet(stream):
            await _close(stream)
            return
        kept = self._kept.setdefault(key, [])
        kept.append(Idle(stream, address, self._clock(), asyncio.get_running_loop()))
        dropped = self._expired()
        while len(kept) > self._per_key:
            dropped.append(kept.pop(0))
        while len(self) > self._size:
            oldest = min(self._kept, key=lambda k: self._kept[k][0].since)
            dropped.append(self._kept[oldest].pop(0))
            self._tidy(oldest)
        await self._close_all(dropped)

    def _expired(self) -> list[Idle]:
        ends, loop, dropped = self._clock() - self._idle, asyncio.get_running_loop(), []
        for key in list(self._kept):
            for idle in list(self._kept[key]):
                if idle.loop.is_closed() or (idle.loop is loop and idle.since < ends):
                    self._kept[key].remove(idle)
                    dropped.append(idle)
            self._tidy(key)
        return dropped

    def _tidy(self, key: PoolKey) -> None:
        if not self._kept.get(key, True):
            del self._kept[key]

    async def aclose(self) -> None:
        """Close every kept connection of the running event loop (and of finished ones)."""
        loop = asyncio.get_running_loop()
        dropped = [idle for kept in self._kept.values() for idle in kept if idle.loop is loop or idle.loop.is_closed()]
        for key in list(self._kept):
            self._kept[key] = [idle for idle in self._kept[key] if idle not in dropped]
            self._tidy(key)
        await self._close_all(dropped)

    async def _close_all(self, dropped: list[Idle]) -> None:
        for idle in dropped:
            await self._close(idle)

    async def _close(self, idle: Idle) -> None:
        # Another loop's connection is only let go: a finished loop's transport closes its socket when
        # collected (tests, benchmarks); a running one's is never taken from here.
        if idle.loop is asyncio.get_running_loop():
            await _close(idle.stream)


async def _close(stream: TLSStream) -> None:
    with anyio.CancelScope(shield=True), contextlib.suppress(OSError, anyio.BrokenResourceError):
        await stream.aclose()
