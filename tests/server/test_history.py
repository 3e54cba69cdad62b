"""The run history follows the event hub: each RunFinished becomes one row of the executions table."""

from __future__ import annotations

import anyio
import pytest

from mcp_sandbox.events import EventHub, RunFinished, ToolCalled
from mcp_sandbox.server.history import History, execution_record
from mcp_sandbox.workspace import Metadata
from postgres_helpers import MetadataTarget

pytestmark = pytest.mark.anyio


def _finished(status: str) -> RunFinished:
    return RunFinished(
        "alice", "key-1", "python", "bwrap", status, 0.25, exit_code=0, stdout_bytes=6, stderr_bytes=2,
        files_bytes=10, started_at=1_700_000_000.5, run_ms=17,
    )  # fmt: skip


def test_the_history_row_is_the_run_event_with_the_runs_own_time() -> None:
    record = execution_record(_finished("success"))
    assert (record.tenant, record.conversation, record.language, record.status) == (
        "alice",
        "key-1",
        "python",
        "success",
    )
    assert (record.started_at, record.duration_ms, record.exit_code) == (1_700_000_000.5, 17, 0)
    assert (record.stdout_bytes, record.stderr_bytes, record.files_bytes) == (6, 2, 10)


def test_a_run_refused_as_busy_is_an_error_in_the_history() -> None:
    assert execution_record(_finished("busy")).status == "error"


async def test_runs_emitted_to_the_hub_are_written_once_and_other_events_not(metadata_target: MetadataTarget) -> None:
    metadata = Metadata.open(metadata_target.path, metadata_target.url)
    try:
        hub = EventHub()
        with anyio.fail_after(10):
            async with anyio.create_task_group() as writes:
                hub.subscribe(History(metadata, writes).observe)
                for status in ("success", "error", "busy"):
                    hub.emit(_finished(status))
                hub.emit(ToolCalled("alice", None, "time", "now", "ok", 0.01))
            # The task group's exit waited for the writes.
    finally:
        metadata.close()
    rows = metadata_target.query("SELECT status, duration_ms, started_at FROM executions ORDER BY status")
    assert rows == [("error", 17, 1_700_000_000.5)] * 2 + [("success", 17, 1_700_000_000.5)]
