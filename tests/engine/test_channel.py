"""The host's end of the frame channel (engine.channel.Channel), over a real socketpair."""

from __future__ import annotations

import array
import os
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import partial
from typing import Any

import anyio
import anyio.to_thread
import pytest

from mcp_sandbox.engine.channel import Channel
from mcp_sandbox.errors import ChannelError, FrameError
from mcp_sandbox.runners.python.mcp_sandbox_runtime import frames
from mcp_sandbox.runners.python.mcp_sandbox_runtime.frames import Call, Done, Exec, Kind, Ready, Reply

pytestmark = pytest.mark.anyio

MAX_FRAME = 64 << 20
# Every wait in these tests is bounded; none comes near this when the code works.
DEADLINE_SECONDS = 30.0


@asynccontextmanager
async def channel_pair(max_frame: int = MAX_FRAME) -> AsyncIterator[tuple[Channel, Channel]]:
    left_sock, right_sock = socket.socketpair()
    left = Channel(left_sock, max_frame)
    right = Channel(right_sock, max_frame)
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
        channel = Channel(host_sock, max_frame)
        try:
            yield channel, peer
        finally:
            channel.close()


def _exec(code: str) -> Exec:
    return Exec(run=1, code=code, servers=(), env={}, max_images=0, max_image_bytes=0, last=True)


def raw_frame(payload: bytes, *, version: int = frames.PROTOCOL_VERSION, kind: int = Kind.DONE) -> bytes:
    return frames.HEADER.pack(frames.MAGIC, version, kind, len(payload)) + payload


async def test_a_frame_sent_on_one_end_is_received_on_the_other() -> None:
    reply = Reply(1, {"text": "héllo ✓"})
    with anyio.fail_after(DEADLINE_SECONDS):
        async with channel_pair() as (host, sandbox):
            await host.send(reply)

            assert await sandbox.receive() == reply


async def test_frames_arrive_in_the_order_they_were_sent() -> None:
    with anyio.fail_after(DEADLINE_SECONDS):
        async with channel_pair() as (host, sandbox):
            for n in range(3):
                await sandbox.send(Call(n, {"op": "list_servers"}))

            assert [await host.receive() for _ in range(3)] == [Call(n, {"op": "list_servers"}) for n in range(3)]


async def test_a_frame_of_20_mebibytes_gets_through() -> None:
    reply = Reply(9, {"data": "y" * (20 << 20)})
    with anyio.fail_after(DEADLINE_SECONDS):
        async with channel_pair() as (host, sandbox), anyio.create_task_group() as tg:
            # The send cannot complete until the other end reads: run both at once.
            tg.start_soon(host.send, reply)
            received = await sandbox.receive()

    assert received == reply


async def test_a_frame_from_the_sandboxs_codec_is_understood_by_the_host() -> None:
    with anyio.fail_after(DEADLINE_SECONDS):
        async with channel_and_peer() as (host, peer):
            frames.write_frame(peer.fileno(), Kind.READY, {"runtime": "python", "version": "3.11.2"})

            assert await host.receive() == Ready("python", "3.11.2")


async def test_a_clean_close_by_the_sandbox_reads_as_none() -> None:
    with anyio.fail_after(DEADLINE_SECONDS):
        async with channel_and_peer() as (host, peer):
            peer.close()

            assert await host.receive() is None


async def test_a_clean_close_after_a_frame_reads_as_that_frame_then_none() -> None:
    with anyio.fail_after(DEADLINE_SECONDS):
        async with channel_and_peer() as (host, peer):
            peer.sendall(frames.encode(Kind.DONE, {"run": 1, "exitCode": 0, "exception": None}))
            peer.close()

            assert await host.receive() == Done(1, 0, None)
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


@pytest.mark.parametrize(
    ("kind", "body"),
    [
        pytest.param(Kind.DONE, {"exitCode": 0, "exception": None}, id="done-without-run"),
        pytest.param(Kind.DONE, {"run": "1", "exitCode": 0, "exception": None}, id="done-run-a-string"),
        pytest.param(Kind.DONE, {"run": 1, "exitCode": True, "exception": None}, id="done-exit-code-a-boolean"),
        pytest.param(Kind.DONE, {"run": 1, "exitCode": 0, "exception": 5}, id="done-exception-a-number"),
        pytest.param(Kind.CALL, {"op": "list_servers"}, id="call-without-id"),
        pytest.param(Kind.CALL, {"op": "list_servers", "id": "1"}, id="call-id-a-string"),
        pytest.param(Kind.DISPLAY, {"run": 1, "mime": "image/png", "data": 5}, id="display-data-a-number"),
        pytest.param(Kind.EXITED, {"run": 1, "exitCode": 0, "problem": []}, id="exited-problem-a-list"),
        pytest.param(Kind.READY, {"runtime": "python"}, id="ready-without-version"),
        pytest.param(Kind.READY, {"runtime": "python", "version": "3", "pid": -1}, id="ready-negative-pid"),
        pytest.param(Kind.ERROR, {"message": None}, id="error-without-message"),
    ],
)
async def test_a_frame_with_a_field_of_the_wrong_type_raises_frame_error(kind: Kind, body: dict[str, Any]) -> None:
    with anyio.fail_after(DEADLINE_SECONDS):
        async with channel_and_peer() as (host, peer):
            peer.sendall(frames.encode(kind, body))

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
                    await host.send(_exec("x" * (1 << 16)))


# --- descriptors ----------------------------------------------------------------------------------


def _received_fds(peer: socket.socket, size: int) -> tuple[bytes, list[int]]:
    """Receive up to ``size`` bytes and the descriptors that came with them."""
    data, ancillary, _, _ = peer.recvmsg(size, socket.CMSG_SPACE(8 * 4))
    fds: list[int] = []
    for level, kind, payload in ancillary:
        if (level, kind) == (socket.SOL_SOCKET, socket.SCM_RIGHTS):
            fds.extend(array.array("i", payload[: len(payload) - len(payload) % 4]))
    return data, fds


async def test_descriptors_sent_with_a_frame_arrive_with_its_first_bytes() -> None:
    read_end, write_end = os.pipe()
    try:
        with anyio.fail_after(DEADLINE_SECONDS):
            async with channel_and_peer() as (host, peer):
                await host.send(_exec("print(1)"), fds=[write_end, write_end])
                data, fds = _received_fds(peer, 1 << 16)
        assert data == frames.pack(_exec("print(1)"))
        assert len(fds) == 2
        os.write(fds[0], b"through the passed descriptor")
        assert os.read(read_end, 100) == b"through the passed descriptor"
        for fd in fds:
            os.close(fd)
    finally:
        os.close(read_end)
        os.close(write_end)


async def test_a_frame_with_descriptors_larger_than_the_socket_buffer_gets_through() -> None:
    # The first sendmsg cannot take it all: the rest follows once the peer reads (EAGAIN path).
    frame = _exec("z" * (8 << 20))
    read_end, write_end = os.pipe()
    try:
        with anyio.fail_after(DEADLINE_SECONDS):
            async with channel_and_peer() as (host, peer), anyio.create_task_group() as group:
                group.start_soon(partial(host.send, frame, fds=[write_end]))
                parser = frames.FrameParser()
                received_fds: list[int] = []
                while (raw := parser.next()) is None:
                    data, fds = await anyio.to_thread.run_sync(_received_fds, peer, 1 << 20)
                    received_fds += fds
                    parser.feed(data)
        assert raw is not None
        assert frames.decode(*raw) == frame
        assert len(received_fds) == 1
        os.close(received_fds[0])
    finally:
        os.close(read_end)
        os.close(write_end)


async def test_descriptors_the_sandbox_sends_are_never_accepted_by_the_host() -> None:
    read_end, write_end = os.pipe()
    try:
        with anyio.fail_after(DEADLINE_SECONDS):
            async with channel_and_peer() as (host, peer):
                data = frames.encode(Kind.CALL, {"op": "list_servers", "id": 1})
                peer.sendmsg([data], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [write_end]))])
                os.close(write_end)
                assert await host.receive() == Call(1, {"op": "list_servers"})
                # No copy of the write end is left anywhere: the pipe reads as ended.
                assert os.read(read_end, 10) == b""
    finally:
        os.close(read_end)


async def test_closing_the_channel_ends_a_receive_waiting_on_it() -> None:
    with anyio.fail_after(DEADLINE_SECONDS):
        async with channel_and_peer() as (host, _peer), anyio.create_task_group() as group:
            results: list[object] = []

            async def receive() -> None:
                results.append(await host.receive())

            group.start_soon(receive)
            await anyio.wait_all_tasks_blocked()
            host.close()
    assert results == [None]


async def test_a_frame_over_its_kinds_limit_is_refused_on_its_header_before_its_body_arrives() -> None:
    # Issue 21, finding 1: only the header of a 63 MB CALL is sent; the refusal cannot wait for the rest.
    host_sock, peer = socket.socketpair()
    with peer:
        channel = Channel(host_sock, MAX_FRAME, {Kind.CALL: 1 << 20})
        try:
            peer.sendall(frames.HEADER.pack(frames.MAGIC, frames.PROTOCOL_VERSION, Kind.CALL, 63_000_000))
            with anyio.fail_after(DEADLINE_SECONDS), pytest.raises(FrameError, match="CALL"):
                await channel.receive()
        finally:
            channel.close()


async def test_a_limit_for_one_kind_leaves_the_others_at_theirs() -> None:
    host_sock, peer = socket.socketpair()
    with peer:
        channel = Channel(host_sock, MAX_FRAME, {Kind.CALL: 64})
        try:
            frames.write_frame(peer.fileno(), Kind.DONE, {"run": 1, "exitCode": 0, "exception": "x" * 1000})
            with anyio.fail_after(DEADLINE_SECONDS):
                assert await channel.receive() == Done(1, 0, "x" * 1000)
        finally:
            channel.close()
