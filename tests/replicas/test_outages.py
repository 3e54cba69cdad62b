"""An outage of PostgreSQL or the object store is answered 503 with Retry-After, never as missing data.

Real replicas sharing a PostgreSQL database and a SeaweedFS store. A signed link to an
acknowledged file, asked of a replica that reads it from the store while the store is down, was
answered 404 "no such file"; an upload while PostgreSQL was down was answered 409 (do not
retry). Both are outages: 503, the service named, and when to send the request again.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from urllib.parse import urlsplit

import anyio
import pytest

from mcp_test_helpers import bearer_web, new_conversation, upload
from postgres_helpers import Cluster
from replica_helpers import TOKEN, replicas
from s3_helpers import s3_env, s3_server, store_url

pytestmark = [pytest.mark.e2e, pytest.mark.anyio, pytest.mark.slow]


async def test_a_signed_link_read_from_a_stopped_store_answers_503_with_retry_after(
    postgres: Cluster, sandbox_runtime: Path | None
) -> None:
    with contextlib.ExitStack() as store:
        endpoint = store.enter_context(s3_server())  # this test's own store: it is stopped below
        env = {**s3_env(endpoint), "MCP_SANDBOX_OBJECT_STORE_URL": store_url()}
        async with replicas(2, postgres.create_database(), sandbox_runtime, **env) as (owner, other):
            stored = await upload(owner.url, TOKEN, new_conversation(), "kept.txt", b"k" * 100)
            assert stored.status_code == 201, stored.text
            link = urlsplit(stored.json()["files"][0]["url"])
            store.close()  # the store stops; the other replica reads the owner's files from it
            async with bearer_web(TOKEN) as web:
                with anyio.fail_after(60):
                    answered = await web.get(f"{other.url}{link.path}?{link.query}")

    assert answered.status_code == 503, answered.text
    assert answered.headers["Retry-After"].isdigit()
    assert "object store" in answered.json()["error"]


async def test_an_upload_while_postgresql_is_down_answers_503_with_retry_after(
    postgres: Cluster, s3_endpoint: str, sandbox_runtime: Path | None
) -> None:
    env = {**s3_env(s3_endpoint), "MCP_SANDBOX_OBJECT_STORE_URL": store_url()}
    async with replicas(1, postgres.create_database(), sandbox_runtime, **env) as (replica,):
        conversation = new_conversation()
        assert (await upload(replica.url, TOKEN, conversation, "first.txt", b"1")).status_code == 201
        # On this thread, not a worker's: the postmaster dies with the thread that started it (PDEATHSIG).
        postgres.stop()
        try:
            with anyio.fail_after(60):
                refused = await upload(replica.url, TOKEN, conversation, "second.txt", b"2")
        finally:
            postgres.start()

    assert refused.status_code == 503, refused.text
    assert refused.headers["Retry-After"].isdigit()
    assert "metadata database" in refused.json()["error"]
