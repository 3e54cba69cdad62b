"""The host's asyncio end of the frame channel (engine.channel.Channel), over a real socketpair."""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
import pytest

from mcp_sandbox.engine.channel import Channel, Kind
from mcp_sandbox.errors import ChannelError, FrameError
from mcp_sandbox.runners.python.mcp_sandbox_runtime import frames

pytestmark = pytest.mark.anyio

MAX_FRAME = 64 << 20
# Every wait in these tests is bounded; none comes near this when the code works.
DEADLINE_SECONDS = 30.0


@asynccontextmanager
async def channel_pair(max_frame: int = MAX_FRAME) -> AsyncIterator[tuple[Channel, Channel]]:
    left_sock, right_sock = socket.socketpair()
    left = await Channel.open(left_sock, max_frame)
    right = await Channel.open(right_sock, max_frame)
    try:
        yield left, right
    finally:
        left.close()
        right.close()


@asynccontextmanager
async def channel_and_peer(max_frame: int = MAX_FRAME) -> AsyncIterator[tuple[Channel, socket.socket]]:
    """A Channel and the plain socket at the other end, for writing raw bytes at it."""
    host_sock, peer = socket.socketpair()
    with peer:
        channel = await Channel.open(host_sock, max_frame)
        try:
            yield channel, peer
        finally:
            channel.close()


def raw_frame(payload: bytes, *, version: int = frames.PROTOCOL_VERSION, kind: int = Kind.DONE) -> bytes:
    return frames.HEADER.pack(frames.MAGIC, version, kind, len(payload)) + payload


async def test_a_frame_sent_on_one_end_is_received_on_the_other() -> None:
    body: dict[str, Any] = {"id": 1, "ok": True, "result": {"text": "héllo ✓"}}
    with anyio.fail_after(DEADLINE_SECONDS):
        async with channel_pair() as (host, sandbox):
            await host.send(Kind.REPLY, body)

            assert await sandbox.receive() == (Kind.REPLY, body)


async def test_frames_arrive_in_the_order_they_were_sent() -> None:
    with anyio.fail_after(DEADLINE_SECONDS):
        async with channel_pair() as (host, sandbox):
            for n in range(3):
                await sandbox.send(Kind.CALL, {"id": n})

            assert [await host.receive() for _ in range(3)] == [(Kind.CALL, {"id": n}) for n in range(3)]


async def test_a_frame_of_20_mebibytes_gets_through() -> None:
    body = {"id": 9, "ok": True, "data": "y" * (20 << 20)}
    with anyio.fail_after(DEADLINE_SECONDS):
        async with channel_pair() as (host, sandbox), anyio.create_task_group() as tg:
            # The send cannot complete until the other end reads: run both at once.
            tg.start_soon(host.send, Kind.REPLY, body)
            received = await sandbox.receive()

    assert received == (Kind.REPLY, body)


async def test_a_frame_from_the_sandboxs_codec_is_understood_by_the_host() -> None:
    with anyio.fail_after(DEADLINE_SECONDS):
        async with channel_and_peer() as (host, peer):
            frames.write_frame(peer.fileno(), Kind.READY, {"runtime": "python"})

            assert await host.receive() == (Kind.READY, {"runtime": "python"})


async def test_a_clean_close_by_the_sandbox_reads_as_none() -> None:
    with anyio.fail_after(DEADLINE_SECONDS):
        async with channel_and_peer() as (host, peer):
            peer.close()

            assert await host.receive() is None


async def test_a_clean_close_after_a_frame_reads_as_that_frame_then_none() -> None:
    with anyio.fail_after(DEADLINE_SECONDS):
        async with channel_and_peer() as (host, peer):
            peer.sendall(frames.encode(Kind.DONE, {"exitCode": 0, "exception": None}))
            peer.close()

            assert await host.receive() == (Kind.DONE, {"exitCode": 0, "exception": None})
            assert await host.receive() is None


@pytest.mark.parametrize(
    ("data", "max_frame"),
    [
        pytest.param(raw_frame(b"{}", kind=max(Kind) + 1), MAX_FRAME, id="unknown-kind"),
        pytest.param(raw_frame(b"{}", kind=0), MAX_FRAME, id="kind-zero"),
        pytest.param(raw_frame(b"{}", version=frames.PROTOCOL_VERSION + 1), MAX_FRAME, id="newer-version"),
        pytest.param(raw_frame(b"{}", version=0), MAX_FRAME, id="older-version"),
        pytest.param(b"HTTP/1.1 200 OK\r\n\r\n", MAX_FRAME, id="wrong-magic"),
        pytest.param(raw_frame(b'{"a":"xyzw"}'), 11, id="over-max-frame"),
        pytest.param(raw_frame(b"not json"), MAX_FRAME, id="not-json"),
        pytest.param(raw_frame(b"[1, 2]"), MAX_FRAME, id="json-array"),
        pytest.param(frames.encode(Kind.DONE, {})[:5], MAX_FRAME, id="truncated-header"),
        pytest.param(frames.encode(Kind.DONE, {"exitCode": 0})[:-3], MAX_FRAME, id="truncated-body"),
    ],
)
async def test_a_malformed_frame_from_the_sandbox_raises_frame_error(data: bytes, max_frame: int) -> None:
    with anyio.fail_after(DEADLINE_SECONDS):
        async with channel_and_peer(max_frame) as (host, peer):
            peer.sendall(data)
            peer.close()

            with pytest.raises(FrameError):
                await host.receive()


async def test_a_deeply_nested_body_from_the_sandbox_raises_frame_error() -> None:
    # Ten times Python's default recursion limit, yet small enough for the socket's buffer.
    payload = b'{"a":' + b"[" * 10_000 + b"]" * 10_000 + b"}"
    with anyio.fail_after(DEADLINE_SECONDS):
        async with channel_and_peer() as (host, peer):
            peer.sendall(raw_frame(payload))

            with pytest.raises(FrameError):
                await host.receive()


async def test_frame_error_is_a_channel_error() -> None:
    with anyio.fail_after(DEADLINE_SECONDS):
        async with channel_and_peer() as (host, peer):
            peer.sendall(b"garbage!!!")

            with pytest.raises(ChannelError):
                await host.receive()


async def test_sending_to_a_closed_sandbox_raises_channel_error() -> None:
    with anyio.fail_after(DEADLINE_SECONDS):
        async with channel_and_peer() as (host, peer):
            peer.close()

            with pytest.raises(ChannelError):
                # A single small write may still land in the kernel's buffer; keep going.
                for _ in range(64):
                    await host.send(Kind.EXEC, {"code": "x" * (1 << 16)})
