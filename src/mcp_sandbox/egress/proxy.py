"""The egress proxy of one run: HTTP CONNECT and plain HTTP forwarding on a Unix socket, enforcing the run's grant.

The sandbox has no interface but loopback; a relay in it (the runner's) forwards each TCP
connection made to the proxy address on its loopback to this socket, bound into the sandbox
(:mod:`.listener` serves it). What :class:`EgressProxy` checks of each connection, and in which
order, is its docstring. A refusal before the tunnel is an HTTP 403 whose body names the rule.
Each connection is one line in the egress log (:mod:`.audit`), up to a cap per run, then one line
summing the rest (:meth:`EgressProxy.summarize`, at the run's end). Everything runs in the caller's
event loop, on anyio.
"""

from __future__ import annotations

import collections
import contextlib
import ipaddress
import logging
import uuid
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

import anyio
from anyio.abc import ByteReceiveStream, ByteStream, SocketStream, TaskGroup
from anyio.streams.buffered import BufferedByteReceiveStream

from mcp_sandbox import tracing
from mcp_sandbox.audit import AuditLog
from mcp_sandbox.egress.addresses import IPAddress, is_own
from mcp_sandbox.egress.audit import LINES_PER_RUN, AuditRecord, summary_line
from mcp_sandbox.egress.audit import Connection as _Connection
from mcp_sandbox.egress.heads import Refused, answer, forwarded_head, printable
from mcp_sandbox.egress.resolve import Resolver, is_address, system_resolver
from mcp_sandbox.egress.rules import EgressGrant, Refusal
from mcp_sandbox.egress.secrets import foreign_placeholder, secrets_for
from mcp_sandbox.egress.secured import serve_secured
from mcp_sandbox.egress.tls import RECORD_HEADER, client_hello_length, server_name
from mcp_sandbox.events import EgressConnection, Observer, unheard

if TYPE_CHECKING:
    from mcp_sandbox.egress.authority import Authority

__all__ = ["EgressProxy"]

logger = logging.getLogger(__name__)

_MAX_HEAD = 16 << 10
_HEAD_TIMEOUT = 30.0
_CONNECT_TIMEOUT = 15.0
_HELLO_TIMEOUT = 15.0
_CHUNK = 64 << 10


class EgressProxy:
    """The proxy of one run; serves connections handed to :meth:`handle`, counts against the grant's caps.

    For every connection the proxy:

    1. reads one request head (CONNECT ``host:port``, or a request with an absolute ``http://`` URL);
    2. checks the name and port against the rules *before* resolving it (a refused name is never
       looked up, so made-up names cannot carry data to a DNS server), then resolves it on the host
       and checks every address (no private, loopback, link-local, multicast or metadata address
       unless allowed), and connects to the address it checked (no second lookup to rebind);
    3. for CONNECT, answers 200 and reads the TLS ClientHello: it must be TLS and name the same host
       (SNI), or the tunnel is closed; for plain HTTP, forwards that one request with
       ``Connection: close`` (a second request on the connection cannot name another host);
    4. copies bytes both ways within the run's caps (bytes, connections, connection duration).
    """

    def __init__(
        self,
        grant: EgressGrant,
        audit: AuditLog | None,
        resolver: Resolver = system_resolver,
        emit: Observer = unheard,
        authority: Authority | None = None,
    ) -> None:
        """``emit``: hears each connection as an :class:`~mcp_sandbox.events.EgressConnection` (metrics).

        ``authority``: signs the leaves of the hosts a secret of the grant goes to (None: no secret applies).
        """
        self.grant = grant
        self._authority = authority
        self.run = uuid.uuid4().hex[:16]
        self._audit = audit
        self._emit = emit
        self._resolve = resolver
        self.connections = 0
        self.bytes = 0
        self._lines = 0
        self._unlogged: collections.Counter[str] = collections.Counter()  # verdicts past LINES_PER_RUN

    # --- one connection -------------------------------------------------------------------------

    async def handle(self, client: SocketStream) -> None:
        """Serve one connection from the sandbox's relay until either side is done."""
        async with client:
            # Every connection counts, refused or malformed ones too: a run cannot flood the
            # audit log (past the cap, only the first refusal is written).
            self.connections += 1
            if self.connections > self.grant.max_connections + 1:
                return
            reader = BufferedByteReceiveStream(client)
            try:
                with anyio.fail_after(_HEAD_TIMEOUT):
                    head = await reader.receive_until(b"\r\n\r\n", _MAX_HEAD)
            except (TimeoutError, anyio.EndOfStream, anyio.IncompleteRead, anyio.DelimiterNotFound, OSError):
                return
            except anyio.BrokenResourceError:
                return
            connection = _Connection(host="?", port=0, method="?")
            with tracing.span("egress connection", kind=tracing.SpanKind.CLIENT) as span:
                try:
                    await self._serve(client, reader, head, connection)
                except Refused as refused:
                    connection.verdict, connection.rule = "refused", refused.refusal.rule
                    await answer(client, refused, connection.host, connection.port)
                except (OSError, anyio.BrokenResourceError, anyio.ClosedResourceError, anyio.EndOfStream):
                    pass  # either side went away: the line below says how far it got
                except Exception:  # one connection's bug must not end the run's other connections
                    logger.exception("egress proxy: a connection failed")
                finally:
                    c = connection
                    self._emit(EgressConnection(self.grant.tenant, c.verdict, c.rule, c.sent, c.received))
                    try:
                        self._record(connection)
                    except OSError as exc:
                        logger.error("egress proxy: cannot write the audit log: %s", exc)
                    if span is not None:
                        span.set_attributes(self._entry(connection).span_attributes())

    async def _serve(
        self, client: SocketStream, reader: BufferedByteReceiveStream, head: bytes, c: _Connection
    ) -> None:
        lines = head.decode("latin-1").split("\r\n")
        parts = lines[0].split(" ")
        if len(parts) != 3 or not parts[2].startswith("HTTP/1.") or not printable(lines[0]):
            raise Refused(Refusal("request", "not an HTTP/1 proxy request"), 400)
        method, target, _version = parts
        c.method = method[:16]
        if method == "CONNECT":
            host, _, port_text = target.rpartition(":")
            if not port_text.isdigit() or not host:
                raise Refused(Refusal("request", "CONNECT needs host:port"), 400)
            c.host, c.port = host.removeprefix("[").removesuffix("]")[:255], int(port_text)
            self._check(c)
            applied = secrets_for(self.grant.secrets, c.host) if self._authority is not None else ()
            if applied and self._authority is not None:
                await serve_secured(self, self._authority, client, reader, c, applied)
                return
            upstream = await self.connect(c)
            async with upstream:
                await client.send(b"HTTP/1.1 200 Connection established\r\n\r\n")
                hello = await self.client_hello(reader, c)
                if hello is None:
                    return
                await upstream.send(hello)
                c.sent += len(hello)
                self.bytes += len(hello)
                await self._pump(reader, client, upstream, c)
            return
        url = urlsplit(target)
        if url.scheme != "http" or not url.netloc:
            raise Refused(
                Refusal("request", "only http:// URLs are forwarded; use CONNECT (HTTPS_PROXY) for https"), 400
            )
        if "@" in url.netloc:
            raise Refused(Refusal("request", "credentials in the URL are refused"), 400)
        try:
            port = url.port or 80
        except ValueError:
            raise Refused(Refusal("request", "the URL's port is not a number"), 400) from None
        c.host, c.port = (url.hostname or "")[:255], port
        if not printable(url.netloc):
            raise Refused(Refusal("host_syntax", "the host name holds a control character"))
        secret = foreign_placeholder(self.grant.secrets, None, head)
        if secret is not None:  # in the clear, to no host it may go to (or to its own, unencrypted)
            raise Refused(Refusal("secret_placeholder", f"secret {secret.name!r} goes only over HTTPS to its hosts"))
        request = forwarded_head(method, url.path or "/", url.query, url.netloc, lines[1:])
        upstream = await self._open(c)
        async with upstream:
            await upstream.send(request)
            c.sent += len(request)
            self.bytes += len(request)
            await self._pump(reader, client, upstream, c)

    async def _open(self, c: _Connection) -> SocketStream:
        """Check ``c``'s host and port, resolve, check the addresses and connect to a checked one.

        Raises:
            Refused: a rule refused it (403), or no address answered (502).
        """
        self._check(c)
        return await self.connect(c)

    def _check(self, c: _Connection) -> None:
        """Check the run's caps and ``c``'s host and port (``c.host`` normalised), before any resolving.

        Raises:
            Refused: a cap or a rule refused it.
        """
        grant = self.grant
        if self.connections > grant.max_connections:
            raise Refused(Refusal("egress_max_connections", f"this run used its {grant.max_connections} connections"))
        if self.bytes >= grant.max_bytes:
            raise Refused(Refusal("egress_max_bytes", f"this run used its {grant.max_bytes} bytes"))
        checked = grant.rules.check_name(c.host, c.port)
        if isinstance(checked, Refusal):
            raise Refused(checked)
        c.host = checked

    def refusal(self, address: IPAddress, c: _Connection) -> Refusal | None:
        if any(is_own(address, c.port, host, port) for host, port in self.grant.own):
            return Refusal("proxy_itself", "the server's own address is refused")
        return self.grant.rules.check_address(address)

    async def connect(self, c: _Connection) -> SocketStream:
        """Resolve ``c.host`` (checked), check the addresses and connect to a checked one.

        Raises:
            Refused: a rule refused every address (403), or none answered (502).
        """
        checked = c.host
        try:
            addresses = [ipaddress.ip_address(checked)] if is_address(checked) else await self._resolve(checked, c.port)
        except OSError:
            raise Refused(Refusal("resolve", f"{checked} does not resolve"), 502) from None
        refusal: Refusal | None = None
        for address in addresses:
            refusal = self.refusal(address, c)
            if refusal is not None:
                continue
            c.address = str(address)
            try:
                with anyio.fail_after(_CONNECT_TIMEOUT):
                    return await anyio.connect_tcp(str(address), c.port)
            except (OSError, TimeoutError):
                refusal = Refusal("unreachable", f"{checked}:{c.port} did not answer")
        if refusal is None:
            refusal = Refusal("resolve", f"{checked} has no address")
        raise Refused(refusal, 502 if refusal.rule == "unreachable" else 403)

    async def client_hello(self, reader: BufferedByteReceiveStream, c: _Connection) -> bytes | None:
        """The ClientHello the tunnel starts with, if it names ``c.host``; None (and the verdict) if not."""
        c.verdict = "refused"
        try:
            with anyio.fail_after(_HELLO_TIMEOUT):
                header = await reader.receive_exactly(RECORD_HEADER)
                length = client_hello_length(header)
                if length is None or length > _MAX_HEAD:
                    c.rule = "tls_required"
                    return None
                record = header + await reader.receive_exactly(length - RECORD_HEADER)
            name = server_name(record)
        except (TimeoutError, ValueError, anyio.EndOfStream, anyio.IncompleteRead, anyio.BrokenResourceError):
            c.rule = "tls_required"
            return None
        literal = c.address is not None and c.host == c.address
        if name != c.host and not (name is None and literal):
            c.rule = "tls_sni"
            return None
        return record

    async def _pump(self, reader: ByteReceiveStream, client: ByteStream, upstream: ByteStream, c: _Connection) -> None:
        c.verdict, c.rule = "allowed", "egress_allow"
        with anyio.move_on_after(self.grant.connection_timeout) as scope:
            async with anyio.create_task_group() as group:
                group.start_soon(self._copy, reader, upstream, c, True, group)
                group.start_soon(self._copy, upstream, client, c, False, group)
        if scope.cancelled_caught and c.verdict == "allowed":
            c.verdict, c.rule = "cut", "egress_connection_timeout"

    async def _copy(
        self, source: ByteReceiveStream, sink: ByteStream, c: _Connection, outbound: bool, group: TaskGroup
    ) -> None:
        try:
            async for chunk in source:
                if self.bytes + len(chunk) > self.grant.max_bytes:  # what would pass the cap is not sent
                    c.verdict, c.rule = "cut", "egress_max_bytes"
                    group.cancel_scope.cancel()
                    return
                self.bytes += len(chunk)
                if outbound:
                    c.sent += len(chunk)
                else:
                    c.received += len(chunk)
                await sink.send(chunk)
            with contextlib.suppress(OSError, anyio.BrokenResourceError, anyio.ClosedResourceError):
                await sink.send_eof()
        except (OSError, anyio.BrokenResourceError, anyio.ClosedResourceError):
            group.cancel_scope.cancel()

    def summarize(self) -> None:
        """Write the line summing the connections past the cap, if there were any (at the run's end).

        Raises:
            OSError: the log cannot be written.
        """
        if self._audit is not None and self._unlogged:
            grant = self.grant
            self._audit.write(summary_line(grant.tenant, grant.conversation, self.run, self._unlogged))
            self._unlogged.clear()

    def _record(self, c: _Connection) -> None:
        if self._audit is None:
            return
        if self._lines >= LINES_PER_RUN:
            self._unlogged[c.verdict] += 1
            return
        self._lines += 1
        self._audit.write(self._entry(c).line())

    def _entry(self, c: _Connection) -> AuditRecord:
        return AuditRecord(
            tenant=self.grant.tenant,
            conversation=self.grant.conversation,
            run=self.run,
            host=c.host,
            port=c.port,
            verdict=c.verdict,
            rule=c.rule,
            address=c.address,
            sent=c.sent,
            received=c.received,
            method=c.method,
            secrets=c.secrets,
            trace_id=tracing.trace_id(),
        )
