"""The HTTP server's log limiter, and the per-tenant caps of a server with one tenant."""

from __future__ import annotations

import logging
from pathlib import Path

from mcp_sandbox.config import load_settings, with_tenant_caps
from mcp_sandbox.server.transport.limits import RateLimitedLog


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


def test_with_one_tenant_the_per_tenant_caps_take_nothing_from_the_servers_capacity(tmp_path: Path) -> None:
    settings = load_settings(env={}, flags={"state_dir": str(tmp_path)})
    alone = with_tenant_caps(settings, 1)
    assert alone.admission.tenant_concurrent_runs == settings.admission.max_concurrent_runs
    assert alone.sessions.tenant_sessions == settings.sessions.max_sessions
    assert alone.workspaces.tenant_workspaces_bytes == settings.workspaces.max_workspaces_bytes
    shared = with_tenant_caps(settings, 2)
    assert (shared.admission.tenant_concurrent_runs, shared.workspaces.tenant_workspaces_bytes) == (2, 5 << 30)
    # What the operator set is kept either way.
    chosen = load_settings(env={}, flags={"state_dir": str(tmp_path), "tenant_concurrent_runs": "3"})
    assert (
        with_tenant_caps(chosen, 2).admission.tenant_concurrent_runs
        == with_tenant_caps(chosen, 1).admission.tenant_concurrent_runs
        == 3
    )
    # The engine on its own (no server deciding) has no per-tenant caps.
    assert settings.admission.tenant_concurrent_runs is None
