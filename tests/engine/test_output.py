"""CappedOutput: keeps the first `cap` bytes of a stream, counts them all."""

from __future__ import annotations

import asyncio
import os

import anyio
import anyio.lowlevel
import anyio.to_thread
import pytest

from mcp_sandbox.engine.output import CappedOutput, pump_stream, run_pipes


def test_the_first_cap_bytes_are_kept_across_chunks() -> None:
    output = CappedOutput(cap=5)

    output.feed(b"abc")
    output.feed(b"defgh")
    output.feed(b"ijk")

    assert output.text().startswith("abcde")
    assert "fgh" not in output.text()
    assert "ijk" not in output.text()


def test_every_byte_is_counted_including_the_dropped_ones() -> None:
    output = CappedOutput(cap=5)

    for chunk in (b"abc", b"defgh", b"ijk"):
        output.feed(chunk)

    assert output.total == 11


def test_output_over_the_cap_is_marked_truncated() -> None:
    output = CappedOutput(cap=5)

    output.feed(b"abcde" + b"z" * 1229)

    assert output.truncated
    marker = output.text().removeprefix("abcde")
    assert "z" not in marker
    assert "1234" in marker  # it says how many bytes were written


def test_output_of_exactly_the_cap_is_not_truncated() -> None:
    output = CappedOutput(cap=5)

    output.feed(b"ab")
    output.feed(b"cde")

    assert not output.truncated
    assert output.text() == "abcde"


def test_output_under_the_cap_is_kept_whole() -> None:
    output = CappedOutput(cap=1 << 20)

    output.feed(b"hello\n")

    assert (output.text(), output.total, output.truncated) == ("hello\n", 6, False)


def test_no_output_is_empty_text() -> None:
    output = CappedOutput(cap=5)

    assert (output.text(), output.total, output.truncated) == ("", 0, False)


def test_invalid_utf8_is_replaced_not_raised() -> None:
    output = CappedOutput(cap=100)

    output.feed(b"ok \xff\xfe end")

    assert output.text() == "ok \ufffd\ufffd end"


def test_a_character_cut_by_the_cap_becomes_a_replacement_character() -> None:
    output = CappedOutput(cap=4)

    output.feed("abcé".encode())  # é is two bytes; the cap falls between them

    assert output.text().startswith("abc\ufffd")
    assert output.truncated


def test_a_character_split_across_chunks_is_decoded_whole() -> None:
    output = CappedOutput(cap=100)
    encoded = "snake 🐍".encode()

    output.feed(encoded[:-2])
    output.feed(encoded[-2:])

    assert output.text() == "snake 🐍"


@pytest.mark.anyio
async def test_pump_reads_a_stream_to_its_end_past_the_cap() -> None:
    stream = asyncio.StreamReader()
    stream.feed_data(b"x" * 300_000)
    stream.feed_data(b"tail")
    stream.feed_eof()
    output = CappedOutput(cap=10)

    with anyio.fail_after(10):
        await pump_stream(stream, output.feed)

    assert output.total == 300_004
    assert output.text().startswith("x" * 10)
    assert output.truncated


@pytest.mark.anyio
async def test_a_pipe_that_never_runs_dry_does_not_starve_the_event_loop() -> None:
    # A writer that never lets the pipe run empty keeps it readable: its reader must still give
    # other tasks turns before it reaches the end.
    output = CappedOutput(cap=10)
    seen: list[int] = []
    with anyio.fail_after(10):
        async with anyio.create_task_group() as tasks:

            async def watch() -> None:
                while True:
                    seen.append(output.total)
                    await anyio.lowlevel.checkpoint()

            tasks.start_soon(watch)
            async with run_pipes(output, CappedOutput(cap=10)) as pipes:
                writer = os.dup(pipes.ends[0])
                pipes.close()
                await anyio.to_thread.run_sync(_write_and_close, writer, b"x" * (4 << 20))
            tasks.cancel_scope.cancel()

    assert output.total == 4 << 20
    assert any(0 < total < 4 << 20 for total in seen), seen


@pytest.mark.anyio
async def test_a_run_pipes_output_written_after_the_block_is_read_until_both_end() -> None:
    stdout, stderr = CappedOutput(cap=100), CappedOutput(cap=100)
    with anyio.fail_after(10):
        async with run_pipes(stdout, stderr) as pipes:
            writers = [os.dup(end) for end in pipes.ends]
            pipes.close()
            os.write(writers[1], b"err\n")
            os.close(writers[1])
        # Left the block with stdout still open: it was read until DRAIN_SECONDS, then no more.
        os.close(writers[0])

    assert (stdout.text(), stderr.text()) == ("", "err\n")


@pytest.mark.anyio
async def test_what_a_listener_raises_while_its_pipe_is_read_is_raised_by_the_block() -> None:
    def refuse(data: bytes) -> None:
        raise ValueError("the listener failed")

    with anyio.fail_after(10), pytest.raises(ValueError, match="the listener failed"):
        async with run_pipes(CappedOutput(cap=10, listener=refuse), CappedOutput(cap=10)) as pipes:
            os.write(pipes.ends[0], b"x")
            pipes.close()


def _write_and_close(fd: int, data: bytes) -> None:
    try:
        os.write(fd, data)
    finally:
        os.close(fd)
