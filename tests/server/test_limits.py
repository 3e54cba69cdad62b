"""The HTTP server's log limiter: one record of a kind per interval, counting what it dropped."""

from __future__ import annotations

import logging

from mcp_sandbox.server.limits import RateLimitedLog


def _record(message: str) -> logging.LogRecord:
    return logging.LogRecord("asyncio", logging.ERROR, __file__, 1, message, None, None)


def test_a_flood_of_one_message_is_let_through_once_per_interval_with_the_count_dropped() -> None:
    now = [0.0]
    limit = RateLimitedLog(10.0, clock=lambda: now[0])
    passed = [limit.filter(_record("socket.accept() out of system resource")) for _ in range(100_000)]
    assert passed.count(True) == 1
    now[0] = 10.5
    record = _record("socket.accept() out of system resource")
    assert limit.filter(record)
    assert "(99999 similar suppressed)" in record.getMessage()
    assert limit.filter(_record("another message"))
