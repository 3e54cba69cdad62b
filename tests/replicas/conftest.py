"""Three replicas behind HAProxy, sharing a PostgreSQL database and a SeaweedFS store (tests/balancer_helpers.py)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from balancer_helpers import ReplicaSet, replica_set
from postgres_helpers import Cluster


@pytest.fixture(scope="module")
async def balanced(postgres: Cluster, s3_endpoint: str, sandbox_runtime: Path | None) -> AsyncIterator[ReplicaSet]:
    """Three replicas of ``serve --transport http`` behind deploy/haproxy.cfg, for the module's tests."""
    async with replica_set(postgres.create_database(), s3_endpoint, runtime=sandbox_runtime) as running:
        yield running
