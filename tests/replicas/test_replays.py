"""The replay record in a real PostgreSQL database: a signature is new once, for every connection and start."""

from __future__ import annotations

import psycopg
import pytest

from mcp_sandbox.errors import WorkspaceError
from mcp_sandbox.replicas.replays import SeenCalls
from mcp_sandbox.workspace.postgres_db import PostgresDatabase
from postgres_helpers import Cluster

pytestmark = pytest.mark.anyio


@pytest.fixture
def url(postgres: Cluster) -> str:
    url = postgres.create_database()
    PostgresDatabase(url).close()  # migrated, as a server's start does
    return url


async def test_a_signature_is_new_once_for_this_start_and_the_next(url: str) -> None:
    first, restarted = SeenCalls(url), SeenCalls(url)
    try:
        assert await first.first("a" * 64, until=2e9, now=1e9)
        assert not await first.first("a" * 64, until=2e9, now=1e9)
        assert not await restarted.first("a" * 64, until=2e9, now=1e9)  # another process, another replica
        assert await restarted.first("b" * 64, until=2e9, now=1e9)
    finally:
        await first.aclose()
        await restarted.aclose()


async def test_a_dropped_connection_is_opened_again_and_a_dead_database_refuses(url: str, postgres: Cluster) -> None:
    seen = SeenCalls(url)
    try:
        assert await seen.first("c" * 64, until=2e9, now=1e9)
        with psycopg.connect(url, autocommit=True) as admin:  # the server drops every other connection
            admin.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                " WHERE datname = current_database() AND pid <> pg_backend_pid()"
            )
        assert await seen.first("d" * 64, until=2e9, now=1e9)
        assert not await seen.first("c" * 64, until=2e9, now=1e9)
    finally:
        await seen.aclose()
    unreachable = SeenCalls("postgresql://nobody@127.0.0.1:1/nothing?connect_timeout=1")
    with pytest.raises(WorkspaceError):
        await unreachable.first("e" * 64, until=2e9, now=1e9)
