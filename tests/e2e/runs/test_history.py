"""Every run's record reaches the history: written after the answer, together with the runs that
ended meanwhile, and the last ones before the service closes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client

from mcp_sandbox import load_settings
from mcp_sandbox.server import build_server
from mcp_sandbox.server.service import open_service
from mcp_sandbox.state import StateLayout
from mcp_test_helpers import run_python, structured
from postgres_helpers import MetadataTarget

pytestmark = [pytest.mark.e2e, pytest.mark.anyio]


async def test_concurrent_runs_are_all_recorded_once_and_the_last_before_closing(
    state_dir: Path, sandbox_runtime: Path | None, metadata_target: MetadataTarget
) -> None:
    flags: dict[str, Any] = {"state_dir": str(state_dir), "discover_servers": False}
    if metadata_target.url is not None:
        flags["database_url"] = metadata_target.url
    if sandbox_runtime is not None:
        flags["python_runtime"] = str(sandbox_runtime)
    settings = load_settings(env={}, flags=flags)
    statuses: list[str] = []

    async def caller(client: Client, number: int) -> None:
        for round_ in range(3):
            code = f"print({number * 10 + round_})" if number != 7 else "raise SystemExit(3)"
            statuses.append(structured(await run_python(client, {"code": code}))["status"])

    async with open_service(settings, http=False) as service, Client(build_server(service)) as client:
        async with anyio.create_task_group() as callers:
            for number in range(16):
                callers.start_soon(caller, client, number)
    # Closed as soon as the last call was answered: the last records were still to be written.

    if metadata_target.url is None:
        metadata_target = MetadataTarget(
            "sqlite", StateLayout.of(settings.paths, settings.sandbox, settings.workspaces).metadata
        )
    else:  # with database_url, no SQLite file is made beside it
        assert not StateLayout.of(settings.paths, settings.sandbox, settings.workspaces).metadata.exists()
    rows = metadata_target.query("SELECT status, count(*), count(DISTINCT id) FROM executions GROUP BY status")
    assert sorted(statuses) == ["error"] * 3 + ["success"] * 45
    assert sorted(rows) == [("error", 3, 3), ("success", 45, 45)]
