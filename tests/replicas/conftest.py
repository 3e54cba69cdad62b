"""Three replicas behind HAProxy, sharing a PostgreSQL database and a SeaweedFS store (tests/replica_helpers.py)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from postgres_helpers import Cluster
from replica_helpers import ReplicaSet, replica_set


@pytest.fixture(scope="module")
async def replicas(postgres: Cluster, sandbox_runtime: Path | None) -> AsyncIterator[ReplicaSet]:
    """Three replicas of ``serve --transport http`` behind deploy/haproxy.cfg, for the module's tests."""
    async with replica_set(postgres.create_database(), runtime=sandbox_runtime) as running:
        yield running
