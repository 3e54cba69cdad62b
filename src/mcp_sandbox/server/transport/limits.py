"""The HTTP server's own bounds against slow or greedy clients: connections, headers, bodies, logs.

uvicorn closes an idle keep-alive connection (``keep_alive_timeout``) but has no deadline for a
request's headers, no cap per client address, no bound on a request's head with its httptools
parser (h11 had 16 KiB), and keeps reading a body nobody will use. Here :func:`protocol_class`
bounds headers and connections over uvicorn's httptools protocol (llhttp parses in C; the h11
protocol's parsing in Python was a sixth of the server's CPU per HTTP call), :class:`SlowBodyGuard` bodies,
:func:`raise_open_files_limit` raises RLIMIT_NOFILE's soft limit to the hard one at start, and
:class:`RateLimitedLog` lets one log record of a kind through per interval (accept errors under
descriptor exhaustion once logged millions of lines).
"""

from __future__ import annotations

import asyncio
import collections
import logging
import math
import resource
import time
from collections.abc import Callable
from typing import Any

import anyio
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from mcp_sandbox.config import HttpSettings
from mcp_sandbox.server.transport.coalesce import CoalescingTransport

__all__ = [
    "MAX_HEAD_BYTES",
    "RateLimitedLog",
    "SlowBodyGuard",
    "protocol_class",
    "raise_open_files_limit",
    "uvicorn_limits",
]

logger = logging.getLogger(__name__)


def _refusal(status: bytes, body: bytes) -> bytes:
    return (
        b"HTTP/1.1 %s\r\ncontent-type: text/plain; charset=utf-8\r\nconnection: close\r\n"
        b"content-length: %d\r\n\r\n%s" % (status, len(body), body)
    )


MAX_HEAD_BYTES = 16 * 1024
"""The most a request's line and headers may take (h11's bound, which uvicorn's h11 protocol kept)."""

_TOO_MANY = _refusal(b"429 Too Many Requests", b"too many open connections from this address; retry later\n")
_FULL = _refusal(b"503 Service Unavailable", b"the server has too many open connections; retry later\n")
_HEAD_TOO_LARGE = _refusal(
    b"431 Request Header Fields Too Large",
    b"the request line and headers take more than %d bytes\n" % MAX_HEAD_BYTES,
)


class RateLimitedLog(logging.Filter):
    """Let the first record of each kind (logger and message template) through, then one per ``interval``.

    A record let through after some were dropped says how many, in ``(N similar suppressed)``.
    """

    def __init__(self, interval: float = 10.0, clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__()
        self.interval = interval
        self._clock = clock
        self._last: dict[tuple[str, str], float] = {}
        self._dropped: collections.Counter[tuple[str, str]] = collections.Counter()

    def filter(self, record: logging.LogRecord) -> bool:
        kind = (record.name, str(record.msg))
        now = self._clock()
        last = self._last.get(kind)
        if last is not None and now - last < self.interval:
            self._dropped[kind] += 1
            return False
        self._last[kind] = now
        if dropped := self._dropped.pop(kind, 0):
            record.msg = f"{record.msg} ({dropped} similar suppressed)"
        return True


def install_log_limits(interval: float = 10.0) -> RateLimitedLog:
    """Rate-limit what the event loop and uvicorn log per connection (accept errors, refusals)."""
    limit = RateLimitedLog(interval)
    for name in ("asyncio", "uvicorn.error", __name__):
        logging.getLogger(name).addFilter(limit)
    return limit


def raise_open_files_limit() -> int:
    """Raise this process's RLIMIT_NOFILE soft limit to its hard limit; return the new soft limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and soft < hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
        except (ValueError, OSError) as exc:  # pragma: no cover - a hard limit we may not reach
            logger.warning("could not raise the open-files limit from %d to %d: %s", soft, hard, exc)
    return soft


class _HeadTooLargeError(Exception):
    """Raised in a parser callback to stop a head past :data:`MAX_HEAD_BYTES`."""


def protocol_class(http: HttpSettings) -> type[HttpToolsProtocol]:
    """uvicorn's httptools protocol bounded by ``http``; one class per server.

    A header deadline (``header_timeout``: a client that sends its headers a byte at a time is
    cut), at most :data:`MAX_HEAD_BYTES` of request line and headers (past it ``431`` and closed:
    llhttp has no bound of its own and httptools buffers a header whole), a cap of
    ``max_connections_per_address`` open connections per client address (past it a connection
    is answered ``429`` and closed), at most half the process's descriptors for connections in
    all (past it ``503`` and closed: the rest stay for sandboxes, workspaces and downstream
    servers), and a connection closed ``header_timeout`` after its response while the client
    still sends a body.
    """
    per_address: collections.Counter[str] = collections.Counter()
    header_timeout = http.header_timeout
    cap = http.max_connections_per_address
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    total_cap = max(64, (soft if soft != resource.RLIM_INFINITY else 1 << 20) // 2)
    total = [0]

    class GuardedProtocol(HttpToolsProtocol):
        _header_timer: asyncio.TimerHandle | None = None
        _address: str | None = None
        _refused = False
        _in_head = False  # between a request's first byte and the end of its headers
        _head_bytes = 0  # bytes read while in a head
        _parsed_head = 0  # bytes of request line and headers parsed
        _head_too_large = False

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            peer = transport.get_extra_info("peername")
            address = str(peer[0]) if isinstance(peer, tuple) and peer else None
            refusal = None
            if total[0] >= total_cap:
                logger.warning("refused a connection: %d connections are open, the most this server takes", total_cap)
                refusal = _FULL
            elif address is not None and per_address[address] >= cap:
                logger.warning("refused a connection: %d connections are open from one address", cap)
                refusal = _TOO_MANY
            if refusal is not None:
                self._refused = True
                transport.write(refusal)
                transport.close()
                return
            total[0] += 1
            if address is not None:
                self._address = address
                per_address[address] += 1
            super().connection_made(CoalescingTransport(transport, self.loop))  # a response: one segment
            self._arm_header_timer()

        def connection_lost(self, exc: Exception | None) -> None:
            if self._refused:
                return  # refused in connection_made: uvicorn never saw it
            total[0] -= 1
            self._disarm_header_timer()
            if self._address is not None:
                per_address[self._address] -= 1
                if not per_address[self._address]:
                    del per_address[self._address]
                self._address = None
            super().connection_lost(exc)

        def data_received(self, data: bytes) -> None:
            if self._refused or self.transport.is_closing():
                return
            cycle = self.cycle
            if self._header_timer is None and (cycle is None or cycle.response_complete):
                self._arm_header_timer()  # the first bytes of a next request on a kept-alive connection
            super().data_received(data)
            if self.cycle is not cycle:  # a request's headers are complete
                self._disarm_header_timer()
            if self._in_head:
                self._head_bytes += len(data)  # (with the end of the message before it, if any)
                if self._head_bytes > MAX_HEAD_BYTES and not self.transport.is_closing():
                    logger.info("refused a request whose line and headers took more than %d bytes", MAX_HEAD_BYTES)
                    self.transport.write(_HEAD_TOO_LARGE)
                    self.transport.close()

        def on_message_begin(self) -> None:
            self._in_head, self._head_bytes, self._parsed_head = True, 0, 0
            super().on_message_begin()

        # A head that arrives whole in one read is counted as the parser hands it over: past the
        # bound the callback raises, the parser stops before the request is dispatched, and the
        # answer uvicorn gives a request it cannot parse is our 431.
        def on_url(self, url: bytes) -> None:
            self._count_parsed(len(url))
            super().on_url(url)

        def on_header(self, name: bytes, value: bytes) -> None:
            self._count_parsed(len(name) + len(value) + 4)  # with ": " and the line's end
            super().on_header(name, value)

        def _count_parsed(self, size: int) -> None:
            self._parsed_head += size
            if self._parsed_head > MAX_HEAD_BYTES:
                self._head_too_large = True
                raise _HeadTooLargeError

        def send_400_response(self, msg: str) -> None:
            if not self._head_too_large:
                super().send_400_response(msg)
            elif not self.transport.is_closing():
                logger.info("refused a request whose line and headers took more than %d bytes", MAX_HEAD_BYTES)
                self.transport.write(_HEAD_TOO_LARGE)
                self.transport.close()

        def on_headers_complete(self) -> None:
            self._in_head = False
            super().on_headers_complete()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            if self.cycle.more_body and not self.transport.is_closing():
                # Answered before the body ended (refused, too slow, too large): the rest of it is
                # read and dropped for at most header_timeout (closing at once would reset the
                # connection under the client before it reads the answer).
                self._arm_header_timer()

        def _arm_header_timer(self) -> None:
            self._disarm_header_timer()
            self._header_timer = self.loop.call_later(header_timeout, self._headers_too_slow)

        def _disarm_header_timer(self) -> None:
            if self._header_timer is not None:
                self._header_timer.cancel()
                self._header_timer = None

        def _headers_too_slow(self) -> None:
            self._header_timer = None
            if not self.transport.is_closing():
                logger.info("closed a connection whose request headers took more than %g s", header_timeout)
                self.transport.close()

    return GuardedProtocol


def uvicorn_limits(http: HttpSettings) -> dict[str, Any]:
    """The keyword arguments of ``uvicorn.Config`` that bound connections (see :func:`protocol_class`)."""
    return {"http": protocol_class(http), "timeout_keep_alive": max(1, math.ceil(http.keep_alive_timeout))}


class SlowBodyGuard:
    """ASGI middleware: ``408`` (and the connection closed) for a request body that is too slow.

    A body must send a chunk every ``read_timeout`` seconds and average ``min_rate`` bytes/s after
    its first ``read_timeout`` seconds.
    Only while the body is still coming: a long-lived response (an SSE stream) that waits on
    ``receive`` for the client's disconnect is not bounded here.
    """

    def __init__(self, app: Any, read_timeout: float, min_rate: int) -> None:
        self._app = app
        self.read_timeout = read_timeout
        self.min_rate = min_rate

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self._app(scope, receive, send)
            return
        started = anyio.current_time()
        received = 0
        body_done = False
        responded = False
        cut = False

        async def guarded_receive() -> Any:
            nonlocal received, body_done, cut
            if body_done or cut:
                return await receive() if not cut else {"type": "http.disconnect"}
            now = anyio.current_time()
            # Allowed so far: read_timeout of grace, then min_rate bytes per second.
            rate_deadline = started + self.read_timeout + received / self.min_rate
            message: Any = None
            with anyio.move_on_after(max(0.0, min(self.read_timeout, rate_deadline - now))):
                message = await receive()
            if message is None:
                cut = True
                if not responded:
                    await _answer_408(send)
                return {"type": "http.disconnect"}
            if message.get("type") == "http.request":
                received += len(message.get("body", b""))
                body_done = not message.get("more_body", False)
            else:
                body_done = True
            return message

        async def watched_send(message: Any) -> None:
            nonlocal responded
            if cut:
                return  # the guard answered for the app
            if message.get("type") == "http.response.start":
                responded = True
            await send(message)

        await self._app(scope, guarded_receive, watched_send)


async def _answer_408(send: Any) -> None:
    body = b"the request body was sent too slowly\n"
    await send(
        {
            "type": "http.response.start",
            "status": 408,
            "headers": [
                (b"content-type", b"text/plain; charset=utf-8"),
                (b"content-length", str(len(body)).encode()),
                (b"connection", b"close"),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})
