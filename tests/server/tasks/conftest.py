"""The task table on each engine of the metadata index (SQLite, PostgreSQL), for the tasks' tests."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from mcp_sandbox.server.tasks.table import TaskTable
from mcp_sandbox.workspace import Metadata
from postgres_helpers import MetadataTarget


@pytest.fixture
async def table(metadata_target: MetadataTarget) -> AsyncIterator[TaskTable]:
    metadata = Metadata.open(metadata_target.path, metadata_target.url)
    try:
        yield TaskTable(metadata.database)
    finally:
        metadata.close()
