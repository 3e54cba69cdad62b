"""A response's head reaches the client with its body, on real loopback TCP (server/transport/coalesce.py)."""

from __future__ import annotations

import asyncio
import select
import socket
from collections.abc import AsyncIterator

import anyio
import anyio.lowlevel
import pytest

from mcp_sandbox.server.transport.coalesce import CoalescingTransport

pytestmark = pytest.mark.anyio

BOUND = 10.0


@pytest.fixture
async def wired() -> AsyncIterator[tuple[CoalescingTransport, socket.socket]]:
    """A coalescing transport over one end of a loopback TCP connection, and the other end."""
    with socket.create_server(("127.0.0.1", 0)) as listener:
        ours = socket.create_connection(listener.getsockname())
        theirs, _ = listener.accept()
    theirs.setblocking(False)
    loop = asyncio.get_running_loop()
    transport, _ = await loop.create_connection(asyncio.Protocol, sock=ours)
    yield CoalescingTransport(transport, loop), theirs
    transport.close()
    theirs.close()


def _read(peer: socket.socket) -> bytes:
    """What one read returns once something arrived (bounded)."""
    readable, _, _ = select.select([peer], [], [], BOUND)
    assert readable, "nothing arrived"
    return peer.recv(1 << 16)


async def test_a_head_is_sent_with_the_body_that_follows_it_in_one_piece(
    wired: tuple[CoalescingTransport, socket.socket],
) -> None:
    coalescing, peer = wired

    coalescing.write(b"HTTP/1.1 200 OK\r\ncontent-length: 4\r\n\r\n")
    with pytest.raises(BlockingIOError):
        peer.recv(1 << 16)  # the head alone is not sent
    coalescing.write(b"body")  # at once, with the head: no wait for the step to end
    whole = _read(peer)

    assert whole == b"HTTP/1.1 200 OK\r\ncontent-length: 4\r\n\r\nbody"


async def test_a_lone_write_is_sent_when_the_step_ends(wired: tuple[CoalescingTransport, socket.socket]) -> None:
    coalescing, peer = wired

    coalescing.write(b"event: one\n\n")
    with anyio.fail_after(BOUND):
        await anyio.lowlevel.checkpoint()
    alone = _read(peer)

    assert alone == b"event: one\n\n"


async def test_closing_sends_what_is_pending_first(wired: tuple[CoalescingTransport, socket.socket]) -> None:
    coalescing, peer = wired

    coalescing.write(b"last words")
    coalescing.close()
    with anyio.fail_after(BOUND):
        await anyio.lowlevel.checkpoint()
    received = _read(peer)
    ended = _read(peer)

    assert coalescing.is_closing()
    assert (received, ended) == (b"last words", b"")
