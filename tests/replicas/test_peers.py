"""The internal hop's client against a real HTTP/1.1 peer on loopback (h11 on a TCP listener, checking its requests).

The peer behaves as a replica's server can: answers and keeps the connection, closes it while
idle (its keep-alive expired, or it was restarted), reads a call and dies, or never answers.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import anyio
import anyio.abc
import h11
import pytest

from mcp_sandbox.errors import LeaseLostError
from mcp_sandbox.replicas.forward import CALL_PATH, Forwarder
from mcp_sandbox.replicas.peers import Broken, Peers, Unreachable
from mcp_sandbox.replicas.refusals import http_status, refusal_of
from mcp_test_helpers import free_port

pytestmark = pytest.mark.anyio

BOUND = 10.0


@dataclass
class Peer:
    url: str
    mode: str = "answer"  # answer | close after answering | hang up | silent | chunked | closing | garbage
    connections: int = 0
    requests: list[bytes] = field(default_factory=list)
    closed: anyio.Event = field(default_factory=anyio.Event)  # the last connection ended
    hung_up: anyio.Event = field(default_factory=anyio.Event)  # the client closed a connection
    received: anyio.Event = field(default_factory=anyio.Event)  # a request came in

    async def handle(self, stream: anyio.abc.SocketStream) -> None:
        self.connections += 1
        self.closed = anyio.Event()
        http = h11.Connection(h11.SERVER)
        parts: list[bytes] = []
        try:
            async with stream:
                while True:
                    event = http.next_event()
                    if event is h11.NEED_DATA:
                        try:
                            http.receive_data(await stream.receive())
                        except (anyio.EndOfStream, anyio.BrokenResourceError):
                            self.hung_up.set()
                            return
                    elif isinstance(event, h11.Data):
                        parts.append(bytes(event.data))
                    elif isinstance(event, h11.EndOfMessage):
                        body, parts = b"".join(parts), []
                        self.requests.append(body)
                        self.received.set()
                        if self.mode == "hang up":
                            return
                        if self.mode == "silent":
                            with contextlib.suppress(anyio.EndOfStream, anyio.BrokenResourceError):
                                await stream.receive()
                            self.hung_up.set()
                            return
                        answer = b'{"echo": %d}' % len(self.requests)
                        if self.mode == "garbage":
                            await stream.send(b"HTTP/1.1 two hundred\r\ncontent-length: 2\r\n\r\n{}")
                            continue
                        if self.mode == "chunked":  # no length: h11 sends chunks, each in its own write
                            await stream.send(http.send(h11.Response(status_code=200, headers=[])) or b"")
                            for part in (answer[:3], answer[3:]):
                                await anyio.sleep(0.01)  # separate segments (the client reads what came)
                                await stream.send(http.send(h11.Data(data=part)) or b"")
                            await stream.send(http.send(h11.EndOfMessage()) or b"")
                            http.start_next_cycle()
                            continue
                        headers = [("content-type", "application/json"), ("content-length", str(len(answer)))]
                        if self.mode == "closing":
                            headers.append(("connection", "close"))
                        out = http.send(h11.Response(status_code=200, headers=headers)) or b""
                        await stream.send(
                            out + (http.send(h11.Data(data=answer)) or b"") + (http.send(h11.EndOfMessage()) or b"")
                        )
                        if self.mode in ("close after answering", "closing"):
                            return  # "closing" said so; the other, as a keep-alive that expires, did not
                        http.start_next_cycle()
                    elif isinstance(event, h11.ConnectionClosed):
                        return
        finally:
            self.closed.set()


@contextlib.asynccontextmanager
async def peer() -> AsyncIterator[Peer]:
    listener = await anyio.create_tcp_listener(local_host="127.0.0.1")
    port = listener.extra(anyio.abc.SocketAttribute.local_port)
    running = Peer(f"http://127.0.0.1:{port}/internal/v1/call")
    async with listener, anyio.create_task_group() as group:
        group.start_soon(listener.serve, running.handle, group)
        yield running
        group.cancel_scope.cancel()


@contextlib.asynccontextmanager
async def client(idle: float = 30.0, read_timeout: float = 30.0) -> AsyncIterator[Peers]:
    peers = Peers(2.0, read_timeout, idle)
    try:
        yield peers
    finally:
        await peers.aclose()


HEADERS = [("content-type", "application/json")]


async def test_consecutive_calls_to_a_replica_share_one_kept_alive_connection() -> None:
    async with peer() as running, client() as peers:
        with anyio.fail_after(BOUND):
            replies = [await peers.post(running.url, b'{"n": %d}' % n, HEADERS) for n in range(3)]

    assert [(reply.status, reply.body) for reply in replies] == [(200, b'{"echo": %d}' % n) for n in (1, 2, 3)]
    assert running.requests == [b'{"n": 0}', b'{"n": 1}', b'{"n": 2}']
    assert running.connections == 1


async def test_a_connection_the_replica_closed_while_idle_is_not_used_and_no_call_is_lost() -> None:
    async with peer() as running, client() as peers:
        running.mode = "close after answering"
        with anyio.fail_after(BOUND):
            await peers.post(running.url, b"first", HEADERS)
            await running.closed.wait()  # its keep-alive expired (or it restarted) before the next call
            second = await peers.post(running.url, b"second", HEADERS)

    assert second.status == 200
    assert running.requests == [b"first", b"second"]
    assert running.connections == 2


async def test_a_connection_idle_longer_than_the_limit_is_not_reused() -> None:
    async with peer() as running, client(idle=0.0) as peers:
        with anyio.fail_after(BOUND):
            await peers.post(running.url, b"first", HEADERS)
            await peers.post(running.url, b"second", HEADERS)

    assert running.requests == [b"first", b"second"]
    assert running.connections == 2


async def test_a_replica_that_is_not_listening_is_unreachable() -> None:
    async with client() as peers:
        with anyio.fail_after(BOUND), pytest.raises(Unreachable):
            await peers.post(f"http://127.0.0.1:{free_port()}/internal/v1/call", b"{}", HEADERS)


async def test_a_replica_that_dies_after_reading_a_call_is_not_sent_it_again() -> None:
    async with peer() as running, client() as peers:
        running.mode = "hang up"
        with anyio.fail_after(BOUND), pytest.raises(Broken):
            await peers.post(running.url, b"once", HEADERS)

    assert running.requests == [b"once"]  # it may have run: never retried


async def test_a_replica_that_does_not_answer_in_time_is_given_up_and_sees_the_hang_up() -> None:
    async with peer() as running, client(read_timeout=0.5) as peers:
        running.mode = "silent"
        with anyio.fail_after(BOUND):
            with pytest.raises(Broken):
                await peers.post(running.url, b"slow", HEADERS)
            await running.hung_up.wait()


async def test_a_call_the_caller_cancels_closes_its_connection_so_the_replica_stops_it() -> None:
    async with peer() as running, client() as peers:
        running.mode = "silent"
        with anyio.fail_after(BOUND):
            async with anyio.create_task_group() as group:
                group.start_soon(peers.post, running.url, b"long", HEADERS)
                await running.received.wait()
                group.cancel_scope.cancel()
            await running.hung_up.wait()  # the owner's route cancels the run on this

        running.mode = "answer"
        with anyio.fail_after(BOUND):
            after = await peers.post(running.url, b"next", HEADERS)
    assert after.status == 200
    assert running.connections == 2


async def test_a_body_larger_than_a_chunk_arrives_whole_and_the_connection_is_kept() -> None:
    body = bytes(range(256)) * (3 * 4096 + 7)  # 3 MiB and more: a forwarded upload
    async with peer() as running, client() as peers:
        with anyio.fail_after(BOUND):
            large = await peers.post(running.url, body, HEADERS)
            small = await peers.post(running.url, b"small", HEADERS)

    assert (large.status, small.status) == (200, 200)
    assert running.requests == [body, b"small"]
    assert running.connections == 1


async def test_an_answer_in_chunks_arrives_whole_and_the_connection_is_kept() -> None:
    async with peer() as running, client() as peers:
        running.mode = "chunked"
        with anyio.fail_after(BOUND):
            replies = [await peers.post(running.url, b"%d" % n, HEADERS) for n in range(2)]

    assert [(reply.status, reply.body) for reply in replies] == [(200, b'{"echo": 1}'), (200, b'{"echo": 2}')]
    assert running.connections == 1


async def test_a_connection_the_answer_says_is_closing_is_not_used_again() -> None:
    async with peer() as running, client() as peers:
        running.mode = "closing"
        with anyio.fail_after(BOUND):
            first = await peers.post(running.url, b"first", HEADERS)
            running.mode = "answer"
            second = await peers.post(running.url, b"second", HEADERS)

    assert (first.body, second.body) == (b'{"echo": 1}', b'{"echo": 2}')
    assert running.connections == 2


async def test_a_malformed_answer_is_a_broken_call_never_sent_again() -> None:
    async with peer() as running, client() as peers:
        running.mode = "garbage"
        with anyio.fail_after(BOUND), pytest.raises(Broken):
            await peers.post(running.url, b"once", HEADERS)
        running.mode = "answer"
        with anyio.fail_after(BOUND):
            after = await peers.post(running.url, b"next", HEADERS)

    assert running.requests == [b"once", b"next"]  # it may have run: never retried
    assert after.status == 200
    assert running.connections == 2  # the connection that carried nonsense is not used again


async def test_a_header_that_would_split_the_request_is_refused_before_anything_is_sent() -> None:
    async with peer() as running, client() as peers:
        with anyio.fail_after(BOUND), pytest.raises(Unreachable):
            await peers.post(running.url, b"{}", [("x-mcp-sandbox-time", "1\r\nx-injected: 1")])

    assert running.requests == []


async def test_an_owner_answering_200_with_no_tool_result_gives_an_error_result_not_a_crash() -> None:
    async with peer() as running:
        forwarder = Forwarder("http://127.0.0.1:1", b"k" * 32, BOUND)
        try:
            with anyio.fail_after(BOUND):
                result = await forwarder.forward(running.url.removesuffix(CALL_PATH), "run_python", {}, "alice")
        finally:
            await forwarder.aclose()

    assert len(running.requests) == 1  # it reached the owner, which answered {"echo": 1}
    assert result.is_error
    assert "answered the call with no tool result" in result.content[0].text  # type: ignore[union-attr]


async def test_an_owner_that_dies_during_a_call_refuses_it_as_a_lost_lease_so_an_upload_is_sent_again() -> None:
    async with peer() as running:
        running.mode = "hang up"
        forwarder = Forwarder("http://127.0.0.1:1", b"k" * 32, BOUND)
        try:
            with anyio.fail_after(BOUND):
                result = await forwarder.forward(running.url.removesuffix(CALL_PATH), "upload_file", {}, "alice")
        finally:
            await forwarder.aclose()

    assert result.is_error and "stopped answering during the call" in result.content[0].text  # type: ignore[union-attr]
    refused = refusal_of(result.meta, "")
    assert isinstance(refused, LeaseLostError) and http_status(refused) == 503  # not 409: resending is right
