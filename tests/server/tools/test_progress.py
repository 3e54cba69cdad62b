"""How a run's output becomes progress notifications: lines, their order and count, pacing under a flood."""

from __future__ import annotations

import anyio
import pytest

from mcp_sandbox.server.tools.progress import BATCH, MAX_LINE, ProgressLines

pytestmark = pytest.mark.anyio


class Sent:
    def __init__(self) -> None:
        self.notifications: list[tuple[float, str]] = []

    async def __call__(self, progress: float, message: str) -> None:
        self.notifications.append((progress, message))


async def test_lines_are_cut_across_chunks_and_streams_and_counted_in_order() -> None:
    sent = Sent()
    lines = ProgressLines(sent)
    with anyio.fail_after(10):
        async with lines.running() as feed:
            feed("stdout", b"one\ntw")
            feed("stderr", b"err\r\n")
            feed("stdout", b"o\r50%\r100%\nlast without end")
    assert sent.notifications == [
        (1, "one"),
        (2, "err"),
        (3, "two"),
        (4, "50%"),
        (5, "100%"),
        (6, "last without end"),
    ]


async def test_a_flood_skips_older_lines_but_the_counter_counts_them_all() -> None:
    sent = Sent()
    lines = ProgressLines(sent)
    with anyio.fail_after(10):
        async with lines.running() as feed:
            feed("stdout", b"".join(b"line %d\n" % i for i in range(10_000)))
    progress = [value for value, _ in sent.notifications]
    assert len(sent.notifications) <= 2 * BATCH
    assert progress == sorted(set(progress))
    assert sent.notifications[-1] == (10_000, "line 9999")


async def test_a_long_line_is_cut_and_invalid_utf8_replaced() -> None:
    sent = Sent()
    with anyio.fail_after(10):
        async with ProgressLines(sent).running() as feed:
            feed("stdout", b"x" * (MAX_LINE + 50) + b"\n\xff\n")
    assert sent.notifications == [(1, "x" * MAX_LINE + "…"), (2, "\ufffd")]


async def test_a_failing_send_stops_the_notifications_not_the_run() -> None:
    calls = 0

    async def broken(progress: float, message: str) -> None:
        nonlocal calls
        calls += 1
        raise OSError("the client is gone")

    with anyio.fail_after(10):
        async with ProgressLines(broken).running() as feed:
            feed("stdout", b"a\nb\nc\n")
    assert calls == 1
