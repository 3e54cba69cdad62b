"""The stdio wire read and written on the event loop cuts and writes lines as the SDK's text layers do."""

from __future__ import annotations

import io
import os
import socket
import threading

import anyio
import pytest

from mcp_sandbox.server.transport.stdio_wire import DIRECT_BYTES, WireLines, WireWriter, loop_native

# Split across reads anywhere, including inside a CRLF and inside a multi-byte character.
pytestmark = pytest.mark.anyio

WIRE = b'{"a":1}\n{"b":"\xc3\xa9"}\r\n{"c":2}\r{"d":"\xff"}\n\n{"e":3}\r\n{"last":true}'


def text_layer_lines(data: bytes) -> list[str]:
    return list(io.TextIOWrapper(io.BytesIO(data), encoding="utf-8", errors="replace"))


async def read_lines(fd: int, before: bytes | None = None) -> list[str]:
    lines = WireLines(fd, (lambda: before) if before is not None else None)
    return [line async for line in lines]


@pytest.mark.parametrize("cut", [1, 5, 9, 17, 18, 19, 30, len(WIRE)])
async def test_lines_match_the_text_layer(cut: int) -> None:
    read, write = os.pipe()
    try:

        def feed() -> None:
            for start in range(0, len(WIRE), cut):
                os.write(write, WIRE[start : start + cut])
            os.close(write)

        writer = threading.Thread(target=feed)
        writer.start()
        got = await read_lines(read)
        writer.join()
    finally:
        os.close(read)
    assert got == text_layer_lines(WIRE)


async def test_what_another_reader_read_comes_first() -> None:
    read, write = os.pipe()
    try:
        os.write(write, WIRE[12:])
        os.close(write)
        assert await read_lines(read, before=WIRE[:12]) == text_layer_lines(WIRE)
    finally:
        os.close(read)


async def test_small_and_large_messages_arrive_whole_over_a_socket() -> None:
    ours, theirs = socket.socketpair()
    assert loop_native(ours.fileno())
    messages = ["x" * 10 + "\n", "é" * DIRECT_BYTES + "\n", "y" * (1 << 20) + "\n", "z\n"]
    received = bytearray()

    def drain() -> None:
        while chunk := theirs.recv(1 << 16):
            received.extend(chunk)

    reader = threading.Thread(target=drain)
    reader.start()
    try:
        writer = WireWriter(ours.fileno())
        with anyio.fail_after(30):
            for message in messages:
                assert await writer.write(message) == len(message)
                await writer.flush()
        ours.shutdown(socket.SHUT_WR)
        reader.join()
    finally:
        ours.close()
        theirs.close()
    assert received.decode() == "".join(messages)


def test_only_pipes_and_sockets_are_served_on_the_loop() -> None:
    read, write = os.pipe()
    try:
        assert loop_native(read) and loop_native(write)
    finally:
        os.close(read)
        os.close(write)
    with open(os.devnull, "rb") as null:
        assert not loop_native(null.fileno())
    assert not loop_native(-1)
