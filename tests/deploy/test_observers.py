"""The audit log and the metrics on their own: JSON lines, rotation, modes; counters from events."""

from __future__ import annotations

import contextlib
import gc
import json
import os
import stat
from pathlib import Path

import httpx2
import pytest

from mcp_sandbox.audit import AuditLog, Tally
from mcp_sandbox.events import EventHub, RunFinished, ToolCalled
from mcp_sandbox.server.metrics import Metrics
from mcp_test_helpers import CALL_BOUND, http_server


def test_audit_lines_are_json_with_time_and_event_and_rotate(tmp_path: Path) -> None:
    path = tmp_path / "logs" / "audit.jsonl"
    log = AuditLog.open(path, max_bytes=400, backups=2)
    try:
        for index in range(20):
            log.record("upload", tenant="t", size=index, outcome="ok")
    finally:
        log.close()
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    rotated = sorted(p.name for p in path.parent.iterdir())
    assert rotated == ["audit.jsonl", "audit.jsonl.1", "audit.jsonl.2"]
    last = [json.loads(line) for line in path.read_text().splitlines()][-1]
    assert last["event"] == "upload" and last["size"] == 19 and last["time"].endswith("Z")


def test_audit_lines_another_writer_appended_count_toward_the_rotation_size(tmp_path: Path) -> None:
    path = tmp_path / "audit.jsonl"
    ours, theirs = AuditLog.open(path, max_bytes=400, backups=5), AuditLog.open(path, max_bytes=1 << 20)
    try:
        ours.record("run", n=0)
        for index in range(1, 20):
            theirs.record("run", n=index)  # never full for theirs
        ours.record("run", n=20)
    finally:
        ours.close()
        theirs.close()
    # Ours rotated at its line because of the other writer's lines, not its own one line before.
    assert (tmp_path / "audit.jsonl.1").exists()
    assert [json.loads(line)["n"] for line in path.read_text().splitlines()] == [20]


def _open_files(path: Path) -> list[str]:
    """This process's descriptors open on ``path`` (or on what it was renamed to)."""
    links = []
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(FileNotFoundError):  # the listing's own descriptor, closed since
            links.append(os.readlink(f"/proc/self/fd/{fd}"))
    return [link for link in links if link.startswith(str(path))]


def test_audit_lines_are_in_the_file_at_once_and_follow_it_when_another_process_moves_it(tmp_path: Path) -> None:
    path = tmp_path / "audit.jsonl"
    log = AuditLog.open(path)
    try:
        log.record("run", n=1)
        assert json.loads(path.read_text())["n"] == 1  # flushed with the call, the log still open
        path.rename(tmp_path / "audit.jsonl.1")  # as logrotate does
        log.record("run", n=2)
        path.unlink()
        log.record("run", n=3)
    finally:
        log.close()
    assert [json.loads(line)["n"] for line in (tmp_path / "audit.jsonl.1").read_text().splitlines()] == [1]
    assert [json.loads(line)["n"] for line in path.read_text().splitlines()] == [3]
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert _open_files(tmp_path) == []


def test_an_audit_log_dropped_or_written_after_close_leaves_no_file_open(tmp_path: Path) -> None:
    path = tmp_path / "audit.jsonl"
    log = AuditLog.open(path)
    log.record("run", n=1)
    assert _open_files(path) != []
    del log
    gc.collect()  # a file closed by the collector instead would be a ResourceWarning: an error here
    assert _open_files(path) == []
    closed = AuditLog.open(path)
    closed.close()
    closed.record("run", n=2)
    assert _open_files(path) == []
    assert [json.loads(line)["n"] for line in path.read_text().splitlines()] == [1, 2]


def test_a_tally_writes_the_first_event_then_one_line_per_interval_with_the_count(tmp_path: Path) -> None:
    path = tmp_path / "audit.jsonl"
    log = AuditLog.open(path)
    now = [100.0]
    tally = Tally(log, "download_refused", 60.0, clock=lambda: now[0])
    try:
        for _ in range(5000):  # a burst within one interval
            tally.note(outcome="invalid")
        assert len(path.read_text().splitlines()) == 1  # the first, at once
        now[0] += 61
        tally.note(outcome="invalid")  # past the interval: the rest of the burst, and this one
        tally.flush()  # nothing left: no line
        now[0] += 1000
        tally.flush()  # a quiet interval writes nothing either
        tally.note(outcome="invalid")  # after the quiet, at once again
    finally:
        log.close()
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert [(line["event"], line["count"], line["outcome"]) for line in lines] == [
        ("download_refused", 1, "invalid"),
        ("download_refused", 5000, "invalid"),
        ("download_refused", 1, "invalid"),
    ]
    assert lines[1]["seconds"] == 61


def test_two_servers_metrics_do_not_share_a_registry() -> None:
    def gauges() -> dict[str, float]:
        return {"sessions": 2}

    first, second = Metrics(gauges, dict), Metrics(gauges, lambda: {"alice": 7})
    hub = EventHub()
    hub.subscribe(first.observe)
    hub.emit(RunFinished("alice", None, "python", "bwrap", "error", 0.5, limits=("memory", "pids")))
    hub.emit(ToolCalled("alice", None, "time", "now", "denied", 0.01))
    text = first.render().decode()
    assert 'mcp_sandbox_limit_events_total{limit="memory"} 1.0' in text
    assert 'mcp_sandbox_limit_events_total{limit="pids"} 1.0' in text
    assert 'mcp_sandbox_tool_calls_total{outcome="denied",server="time"} 1.0' in text
    assert 'mcp_sandbox_warm_pool_runs_total{result="miss"} 1.0' in text
    assert "mcp_sandbox_sessions 2.0" in text
    other = second.render().decode()
    assert "limit_events_total{" not in other and 'mcp_sandbox_stored_bytes{tenant="alice"} 7.0' in other


def test_an_observer_that_fails_does_not_reach_the_emitter(caplog: pytest.LogCaptureFixture) -> None:
    hub = EventHub()
    seen: list[object] = []

    def broken(event: object) -> None:
        raise OSError("disk full")

    hub.subscribe(broken)
    hub.subscribe(seen.append)
    hub.emit(ToolCalled(None, None, "s", "t", "ok", 0.0))
    assert len(seen) == 1 and "observer failed" in caplog.text


@pytest.mark.anyio
@pytest.mark.e2e
async def test_without_metrics_token_metrics_is_not_there_and_health_says_nothing_more(
    state_dir: Path, sandbox_runtime: Path | None
) -> None:
    async with http_server(state_dir, runtime=sandbox_runtime) as base, httpx2.AsyncClient(timeout=CALL_BOUND) as web:
        assert (await web.get(f"{base}/metrics")).status_code == 404
        health = await web.get(f"{base}/healthz")
        assert health.status_code == 200 and health.content == b'{"status":"ok"}'
        ready = await web.get(f"{base}/readyz")
        assert ready.status_code in (200, 503) and set(ready.json()) == {"status"}
