"""Calls forwarded among replicas, for real: server processes on loopback sharing a PostgreSQL database.

Each call goes to the replica a test names, as a balancer without stickiness would send it. A
conversation's calls are run by the replica holding its lease, the others forwarding to it, so
its variables survive calls sent anywhere, a fork runs where its source lives, an upload reaches
the owner's live session, and a call the client cancels is stopped on the owner. The tests that
stop no replica share one set of three (each its own conversations); the others start their own.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import httpx2
import pytest

from mcp_test_helpers import http_client, new_conversation, upload
from postgres_helpers import Cluster
from replica_helpers import (
    METRICS_TOKEN,
    TOKEN,
    Replica,
    call,
    owners,
    replicas,
    run,
    runs_running,
    shared_secret,
    structured_data,
    until,
)
from s3_helpers import s3_env, store_url

pytestmark = [pytest.mark.e2e, pytest.mark.anyio, pytest.mark.slow]


class Fleet:
    """The module's replicas and their database."""

    def __init__(self, database_url: str, replicas: list[Replica]) -> None:
        self.url = database_url
        self.replicas = replicas


@pytest.fixture(scope="module")
async def fleet(postgres: Cluster, sandbox_runtime: Path | None) -> AsyncIterator[Fleet]:
    """Three replicas with the default settings (and a metrics token), for the tests that stop none."""
    url = postgres.create_database()
    async with replicas(3, url, sandbox_runtime, MCP_SANDBOX_METRICS_TOKEN=METRICS_TOKEN) as started:
        yield Fleet(url, started)


async def test_a_conversations_variables_survive_calls_sent_to_different_replicas(fleet: Fleet) -> None:
    url, (first, second, third) = fleet.url, fleet.replicas
    conversation = new_conversation()

    assert (await run(first, conversation, "x = 41\nprint('set')"))["stdout"] == "set\n"
    assert owners(url, conversation) == {first.url}
    on_second = await run(second, conversation, "x += 1\nprint(x)")
    on_third = await run(third, conversation, "print(x + 1)")
    arguments = {"conversationId": conversation, "filename": "n.txt", "content": "Nw=="}  # "7"
    stored = await call(third, "upload_file", arguments)
    read = await run(second, conversation, "print(open('/workspace/n.txt').read(), x)")

    assert (on_second["stdout"], on_second["session"]) == ("42\n", "kept"), on_second
    assert (on_third["stdout"], on_third["session"]) == ("43\n", "kept"), on_third
    assert not stored.is_error, stored
    assert read["stdout"] == "7 42\n", read
    assert owners(url, conversation) == {first.url}  # one owner all along: the others forwarded
    assert len({(r.state / "secret").read_bytes() for r in (first, second, third)}) == 1
    assert (first.state / "secret").read_bytes() == shared_secret(url)
    assert "replica_url is set without internal_port" in first.output()  # /internal/ on the public port


async def test_two_replicas_claiming_a_new_conversation_at_once_agree_on_one_owner(fleet: Fleet) -> None:
    (first, second, _third), conversation = fleet.replicas, new_conversation()
    results: list[dict[str, Any]] = []

    async def append(replica: Replica) -> None:
        results.append(await run(replica, conversation, "n = globals().get('n', 0) + 1\nprint(n)"))

    async with anyio.create_task_group() as group:
        group.start_soon(append, first)
        group.start_soon(append, second)

    assert sorted(result["stdout"] for result in results) == ["1\n", "2\n"], results  # one interpreter
    assert len(owners(fleet.url, conversation)) == 1


async def test_a_fork_sent_to_another_replica_runs_where_its_source_lives_and_carries_its_variables(
    fleet: Fleet,
) -> None:
    (owner, other, _third), source, fork = fleet.replicas, new_conversation(), new_conversation()
    await run(owner, source, "x = 41\nopen('/workspace/f.txt', 'w').write('kept')")

    arguments = {"code": "x += 1\nprint(x, open('/workspace/f.txt').read())", "conversationId": fork}
    forked = structured_data(await call(other, "run_python", {**arguments, "forkFrom": source}, 60))
    again = await run(other, fork, "print(x)")  # the fork's own calls go to its owner too
    untouched = await run(other, source, "print(x)")

    assert forked["stdout"] == "42 kept\n", forked
    assert "stateLost" not in forked
    assert again["stdout"] == "42\n", again
    assert untouched["stdout"] == "41\n", untouched
    assert owners(fleet.url, source) == owners(fleet.url, fork) == {owner.url}


async def test_a_forwarded_call_the_client_cancels_is_stopped_on_the_owner(fleet: Fleet) -> None:
    (owner, other, _third), conversation = fleet.replicas, new_conversation()
    async with httpx2.AsyncClient(timeout=30) as web:
        await run(owner, conversation, "x = 1")

        async def started() -> bool:
            return await runs_running(web, owner) >= 1

        async def stopped() -> bool:
            return await runs_running(web, owner) == 0

        async with http_client(other.url, TOKEN) as client, anyio.create_task_group() as group:
            sleeper = {"code": "import time; time.sleep(120)", "conversationId": conversation}
            group.start_soon(client.call_tool, "run_python", sleeper)
            await until(started, 60)  # the run goes on on the owner
            group.cancel_scope.cancel()  # the client cancels its call (notifications/cancelled)

        await until(stopped, 30)  # far less than the 120 s the run would take
        after = await run(other, conversation, "print('next')", bound=30)
        assert after["stdout"] == "next\n", after


async def test_an_http_upload_to_another_replica_reaches_the_owners_live_session_and_the_store(
    postgres: Cluster, s3_endpoint: str, sandbox_runtime: Path | None
) -> None:
    url = postgres.create_database()
    store = {**s3_env(s3_endpoint), "MCP_SANDBOX_OBJECT_STORE_URL": store_url()}
    async with replicas(2, url, sandbox_runtime, **store) as (owner, other):
        conversation = new_conversation()
        await run(owner, conversation, "x = 1")

        reply = await upload(other.url, TOKEN, conversation, "up.txt", b"sent elsewhere")
        seen = await run(owner, conversation, "print(open('/workspace/up.txt').read(), x)")
        listed = reply.json()["files"][0]
        async with httpx2.AsyncClient(trust_env=False) as client:  # the link, through the other replica
            fetched = await client.get(listed["url"].replace(owner.url, other.url))

        assert reply.status_code == 201, reply.text
        assert (listed["name"], listed["size"]) == ("up.txt", 14)
        assert seen["stdout"] == "sent elsewhere 1\n", seen
        assert (fetched.status_code, fetched.content) == (200, b"sent elsewhere")
        assert owners(url) == {owner.url}
