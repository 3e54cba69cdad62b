"""Replicas behind a balancer, for real: server processes on loopback sharing a PostgreSQL database.

Each call goes to the replica a test names, as a balancer without stickiness would send it. A
conversation's calls are run by the replica holding its lease, the others forwarding to it, so
its variables survive calls sent anywhere; a killed owner is replaced within the lease time,
saying the variables were lost; a clean stop gives its leases back, so nothing waits; the
internal route runs nothing that is not signed with the replicas' shared secret.
"""

from __future__ import annotations

import json
import signal
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio
import httpx2
import pytest
from mcp.types import CallToolResult

from mcp_sandbox.replicas.forward import CALL_PATH
from mcp_sandbox.replicas.leases import STOPPED
from mcp_sandbox.replicas.running import FORWARD_KEY
from mcp_sandbox.replicas.signing import sign
from mcp_sandbox.workspace import derive_key
from mcp_test_helpers import http_client, http_server, mcp_sandbox_cli, new_conversation, upload
from postgres_helpers import Cluster
from replica_helpers import TOKEN, Replica, call, lease_rows, replicas, shared_secret
from s3_helpers import files, s3_env, store_url

pytestmark = [pytest.mark.e2e, pytest.mark.anyio, pytest.mark.slow]

METRICS = "replica-metrics-token-0123456789"


def data(result: CallToolResult) -> dict[str, Any]:
    assert result.structured_content is not None, result
    structured: dict[str, Any] = result.structured_content
    return structured


async def run(replica: Replica, conversation: str, code: str, bound: float = 60.0) -> dict[str, Any]:
    result = await call(replica, "run_python", {"code": code, "conversationId": conversation}, bound)
    return data(result)


def owners(database_url: str) -> set[str]:
    now = time.time()
    return {owner for _key, owner, expires, _epoch in lease_rows(database_url) if expires > now}


async def test_a_conversations_variables_survive_calls_sent_to_different_replicas(
    postgres: Cluster, sandbox_runtime: Path | None
) -> None:
    url = postgres.create_database()
    async with replicas(3, url, sandbox_runtime) as (first, second, third):
        conversation = new_conversation()

        assert (await run(first, conversation, "x = 41\nprint('set')"))["stdout"] == "set\n"
        assert owners(url) == {first.url}
        on_second = await run(second, conversation, "x += 1\nprint(x)")
        on_third = await run(third, conversation, "print(x + 1)")
        upload = {"conversationId": conversation, "filename": "n.txt", "content": "Nw=="}  # "7"
        stored = await call(third, "upload_file", upload)
        read = await run(second, conversation, "print(open('/workspace/n.txt').read(), x)")

        assert (on_second["stdout"], on_second["session"]) == ("42\n", "kept"), on_second
        assert (on_third["stdout"], on_third["session"]) == ("43\n", "kept"), on_third
        assert not stored.is_error, stored
        assert read["stdout"] == "7 42\n", read
        assert owners(url) == {first.url}  # one owner all along: the others forwarded
        assert len({(r.state / "secret").read_bytes() for r in (first, second, third)}) == 1
        assert (first.state / "secret").read_bytes() == shared_secret(url)
        assert "replica_url is set without internal_port" in first.output()  # /internal/ on the public port


async def test_a_killed_owner_is_replaced_within_the_lease_time_and_the_result_says_the_variables_were_lost(
    postgres: Cluster, sandbox_runtime: Path | None
) -> None:
    url = postgres.create_database()
    lease = 4.0
    async with replicas(2, url, sandbox_runtime, MCP_SANDBOX_REPLICA_LEASE=f"{lease:g}") as (owner, other):
        conversation = new_conversation()
        await run(owner, conversation, "x = 1")
        await run(other, conversation, "x += 1")  # forwarded: the owner keeps running it

        owner.kill()
        after = await run(other, conversation, "print('x' in globals())", bound=lease + 60)

        assert after["status"] == "success", after
        assert after["stdout"] == "False\n"  # a fresh interpreter
        assert after["stateLost"] is True
        assert owners(url) == {other.url}
        kept = await run(other, conversation, "x = 5\nprint(x)")
        assert kept["stdout"] == "5\n" and "stateLost" not in kept


async def test_a_cleanly_stopped_replica_gives_its_leases_back_so_the_next_call_does_not_wait(
    postgres: Cluster, sandbox_runtime: Path | None
) -> None:
    url = postgres.create_database()
    lease = 600.0  # a call that waited for the lease to expire could not finish within the bound below
    async with replicas(2, url, sandbox_runtime, MCP_SANDBOX_REPLICA_LEASE=f"{lease:g}") as (owner, other):
        conversation = new_conversation()
        await run(owner, conversation, "x = 1")

        assert await owner.stop() == 0
        assert owners(url) == set()
        after = await run(other, conversation, "print('x' in globals())", bound=60)

        assert after["stdout"] == "False\n", after
        assert (after["stateLost"], after["stateLostReason"]) == (True, STOPPED)  # given back with its session
        assert owners(url) == {other.url}


async def test_a_call_forwarded_to_a_remembered_owner_that_is_gone_lands_on_the_new_owner(
    postgres: Cluster, sandbox_runtime: Path | None
) -> None:
    url = postgres.create_database()
    lease = 600.0  # the owner the forwarding replica remembers is not stale for the whole test
    async with replicas(3, url, sandbox_runtime, MCP_SANDBOX_REPLICA_LEASE=f"{lease:g}") as (first, second, third):
        conversation = new_conversation()
        await run(first, conversation, "x = 1")
        remembered = await run(second, conversation, "print(x)")  # forwarded: second remembers first

        assert await first.stop() == 0  # its lease given back
        await run(third, conversation, "x = 'on third'")  # third takes the lease
        after = await run(second, conversation, "print(x)", bound=60)

        assert remembered["stdout"] == "1\n", remembered
        assert after["stdout"] == "on third\n", after  # not first's (gone), and no wait for a lease
        assert owners(url) == {third.url}


def _signed(key: bytes, body: dict[str, Any]) -> tuple[bytes, dict[str, str]]:
    content = json.dumps(body).encode()
    return content, {"content-type": "application/json", **sign(key, content, time.time())}


async def test_the_internal_route_refuses_unsigned_forged_replayed_and_misdirected_calls(
    postgres: Cluster, sandbox_runtime: Path | None
) -> None:
    url = postgres.create_database()
    async with replicas(2, url, sandbox_runtime) as (target, other), httpx2.AsyncClient(timeout=60) as web:
        conversation = new_conversation()
        marker = "print(open('/workspace/ran.txt', 'a').write('x'))"
        arguments = {"code": marker, "conversationId": conversation}
        body = {"to": target.url, "from": other.url, "tool": "run_python", "tenant": "default", "arguments": arguments}
        endpoint = target.url + CALL_PATH
        key = derive_key(shared_secret(url), FORWARD_KEY)

        unsigned = await web.post(endpoint, json=body)
        content, forged = _signed(b"not the replicas' secret".ljust(32, b"!"), body)
        forged_reply = await web.post(endpoint, content=content, headers=forged)
        content, headers = _signed(key, body)
        with_a_bearer = await web.post(
            endpoint, content=content + b" ", headers={**headers, "Authorization": f"Bearer {TOKEN}"}
        )
        misdirected, misdirected_headers = _signed(key, {**body, "to": other.url})
        elsewhere = await web.post(endpoint, content=misdirected, headers=misdirected_headers)
        stale_content, stale = _signed(key, body)
        stale["x-mcp-sandbox-time"] = f"{time.time() - 3600:.3f}"

        assert [r.status_code for r in (unsigned, forged_reply, with_a_bearer)] == [401, 401, 401]
        assert (await web.get(endpoint)).status_code == 405
        assert elsewhere.status_code == 400
        assert (await web.post(endpoint, content=stale_content, headers=stale)).status_code == 401
        assert lease_rows(url) == []  # nothing ran: no conversation was even claimed

        signed = await web.post(endpoint, content=content, headers=headers)
        replayed = await web.post(endpoint, content=content, headers=headers)

        assert signed.status_code == 200, signed.text
        assert signed.json()["structuredContent"]["stdout"] == "1\n"
        assert replayed.status_code == 401
        checked = await run(other, conversation, "print(open('/workspace/ran.txt').read())")
        assert checked["stdout"] == "x\n"  # the signed call ran once


async def test_a_captured_forwarded_call_replayed_after_its_owner_restarts_is_refused(
    postgres: Cluster, sandbox_runtime: Path | None
) -> None:
    url = postgres.create_database()
    async with replicas(2, url, sandbox_runtime) as (target, other), httpx2.AsyncClient(timeout=60) as web:
        conversation = new_conversation()
        marker = "print(open('/workspace/ran.txt', 'a').write('x'))"
        arguments = {"code": marker, "conversationId": conversation}
        body = {"to": target.url, "from": other.url, "tool": "run_python", "tenant": "default", "arguments": arguments}
        endpoint = target.url + CALL_PATH
        content = json.dumps(body).encode()
        # Stamped ahead (within the window): the restart below fits in the window with room to spare.
        key = derive_key(shared_secret(url), FORWARD_KEY)
        headers = {"content-type": "application/json", **sign(key, content, time.time() + 20)}

        signed = await web.post(endpoint, content=content, headers=headers)  # seen on the hop
        assert signed.status_code == 200, signed.text
        assert await target.stop() == 0
        await target.restart()  # a rollout: the owner's memory of seen calls is gone
        replayed = await web.post(endpoint, content=content, headers=headers)

        assert replayed.status_code == 401, replayed.text
        assert "a replayed request" in target.output()
        checked = await run(target, conversation, "print(open('/workspace/ran.txt').read())")
        assert checked["stdout"] == "x\n"  # the captured call ran once


@pytest.mark.parametrize(
    ("transport", "env"),
    [
        ("http", {}),
        ("stdio", {"MCP_SANDBOX_DATABASE_URL": "postgresql://app@127.0.0.1:1/app"}),
    ],
    ids=["http-without-database_url", "stdio"],
)
def test_a_replica_url_the_server_cannot_use_is_refused_at_start_naming_the_settings(
    state_dir: Path, sandbox_runtime: Path | None, transport: str, env: dict[str, str]
) -> None:
    environment = {"MCP_SANDBOX_REPLICA_URL": "http://127.0.0.1:1", **env}
    done = mcp_sandbox_cli(
        "serve", "--transport", transport, state_dir=state_dir, runtime=sandbox_runtime, env=environment
    )

    assert done.returncode == 2, done
    assert "replica_url" in done.stderr
    assert ("database_url" if transport == "http" else "stdio") in done.stderr


async def test_without_replica_url_a_server_takes_no_lease_and_has_no_internal_route(
    postgres: Cluster, state_dir: Path, sandbox_runtime: Path | None
) -> None:
    url = postgres.create_database()
    env = {"MCP_SANDBOX_TOKEN": TOKEN, "MCP_SANDBOX_DATABASE_URL": url, "MCP_SANDBOX_POOL_MIN": "0"}
    async with http_server(state_dir, env=env, runtime=sandbox_runtime) as base, httpx2.AsyncClient() as web:
        conversation = new_conversation()
        async with http_client(base, TOKEN) as client:
            first = await client.call_tool("run_python", {"code": "x = 2", "conversationId": conversation})
            second = await client.call_tool("run_python", {"code": "print(x)", "conversationId": conversation})

        assert not first.is_error and data(second)["stdout"] == "2\n"
        assert "stateLost" not in data(second)
        assert lease_rows(url) == []
        assert (await web.post(base + CALL_PATH, json={})).status_code == 404


async def _running(web: httpx2.AsyncClient, replica: Replica) -> float:
    reply = await web.get(f"{replica.url}/metrics", headers={"Authorization": f"Bearer {METRICS}"})
    for line in reply.text.splitlines():
        if line.startswith("mcp_sandbox_runs_running "):
            return float(line.split()[1])
    raise AssertionError(reply.text)


async def until(check: Callable[[], Awaitable[bool]], bound: float) -> None:
    """Poll another process's HTTP answers: there is nothing to wait on but the answer itself."""
    with anyio.fail_after(bound):
        while True:
            if await check():
                return
            await anyio.sleep(0.05)


async def test_a_forwarded_call_the_client_cancels_is_stopped_on_the_owner(
    postgres: Cluster, sandbox_runtime: Path | None
) -> None:
    url = postgres.create_database()
    env = {"MCP_SANDBOX_METRICS_TOKEN": METRICS}
    async with replicas(2, url, sandbox_runtime, **env) as (owner, other), httpx2.AsyncClient(timeout=30) as web:
        conversation = new_conversation()
        await run(owner, conversation, "x = 1")

        async def started() -> bool:
            return await _running(web, owner) >= 1

        async def stopped() -> bool:
            return await _running(web, owner) == 0

        async with http_client(other.url, TOKEN) as client, anyio.create_task_group() as group:
            sleeper = {"code": "import time; time.sleep(120)", "conversationId": conversation}
            group.start_soon(client.call_tool, "run_python", sleeper)
            await until(started, 60)  # the run goes on on the owner
            group.cancel_scope.cancel()  # the client cancels its call (notifications/cancelled)

        await until(stopped, 30)  # far less than the 120 s the run would take
        after = await run(other, conversation, "print('next')", bound=30)
        assert after["stdout"] == "next\n", after


async def test_two_replicas_claiming_a_new_conversation_at_once_agree_on_one_owner(
    postgres: Cluster, sandbox_runtime: Path | None
) -> None:
    url = postgres.create_database()
    async with replicas(2, url, sandbox_runtime) as (first, second):
        conversation = new_conversation()
        results: list[dict[str, Any]] = []

        async def append(replica: Replica) -> None:
            results.append(await run(replica, conversation, "n = globals().get('n', 0) + 1\nprint(n)"))

        async with anyio.create_task_group() as group:
            group.start_soon(append, first)
            group.start_soon(append, second)

        assert sorted(result["stdout"] for result in results) == ["1\n", "2\n"], results  # one interpreter
        assert len(owners(url)) == 1


async def test_a_draining_replica_hands_its_idle_conversations_over_at_once(
    postgres: Cluster, sandbox_runtime: Path | None
) -> None:
    url = postgres.create_database()
    env = {"MCP_SANDBOX_METRICS_TOKEN": METRICS, "MCP_SANDBOX_SHUTDOWN_GRACE": "120"}
    async with replicas(2, url, sandbox_runtime, **env) as (owner, other), httpx2.AsyncClient(timeout=30) as web:
        idle, busy = new_conversation(), new_conversation()
        await run(owner, idle, "x = 1")
        await run(owner, busy, "y = 1")

        async def started() -> bool:
            return await _running(web, owner) >= 1

        async def draining() -> bool:
            return (await web.get(f"{owner.url}/readyz")).status_code == 503

        async with anyio.create_task_group() as group:
            group.start_soon(run, owner, busy, "import time; time.sleep(120)", 180.0)
            await until(started, 60)
            owner.process.send_signal(signal.SIGTERM)  # the drain waits for the busy run
            await until(draining, 30)

            moved = await run(other, idle, "print('x' in globals())", bound=30)
            refused = await call(other, "run_python", {"code": "print(y)", "conversationId": busy}, 30)

            assert moved["stdout"] == "False\n" and moved["stateLost"] is True, moved  # given back with its session
            assert moved["stateLostReason"] == STOPPED, moved
            assert refused.is_error and "shutting down" in str(data(refused).get("error")), refused
            assert {o for k, o, e, _ in lease_rows(url) if e > time.time()} == {owner.url, other.url}
            owner.process.send_signal(signal.SIGTERM)  # a second one: the busy run is stopped now


async def test_a_fork_sent_to_another_replica_runs_where_its_source_lives_and_carries_its_variables(
    postgres: Cluster, sandbox_runtime: Path | None
) -> None:
    url = postgres.create_database()
    async with replicas(2, url, sandbox_runtime) as (owner, other):
        source, fork = new_conversation(), new_conversation()
        await run(owner, source, "x = 41\nopen('/workspace/f.txt', 'w').write('kept')")

        arguments = {"code": "x += 1\nprint(x, open('/workspace/f.txt').read())", "conversationId": fork}
        forked = data(await call(other, "run_python", {**arguments, "forkFrom": source}, 60))
        again = await run(other, fork, "print(x)")  # the fork's own calls go to its owner too
        untouched = await run(other, source, "print(x)")

        assert forked["stdout"] == "42 kept\n", forked
        assert "stateLost" not in forked
        assert again["stdout"] == "42\n", again
        assert untouched["stdout"] == "41\n", untouched
        assert owners(url) == {owner.url}


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


async def test_a_tenant_over_its_budget_loses_only_the_conversations_no_replica_is_using(
    postgres: Cluster, s3_endpoint: str, sandbox_runtime: Path | None
) -> None:
    # Each replica's retention spared only its own sessions and calls: a tenant over its budget had
    # the conversation another replica was running evicted, its files deleted from the store (issue 37).
    prefix = store_url()
    env = {
        **s3_env(s3_endpoint),
        "MCP_SANDBOX_OBJECT_STORE_URL": prefix,
        "MCP_SANDBOX_TENANT_WORKSPACES_BYTES": str(1 << 20),
        "MCP_SANDBOX_RETENTION_INTERVAL": "1",
        "MCP_SANDBOX_REPLICA_LEASE": "3",
    }
    async with replicas(2, postgres.create_database(), sandbox_runtime, **env) as (first, second):
        idle, on_first, on_second = new_conversation(), new_conversation(), new_conversation()
        assert (await upload(first.url, TOKEN, idle, "idle.bin", b"i" * (300 << 10))).status_code == 201
        await run(first, on_first, "x = 1\nopen('a.bin', 'wb').write(b'a' * (600 << 10))")
        await run(second, on_second, "y = 2\nopen('b.bin', 'wb').write(b'b' * (600 << 10))")

        def stored() -> set[str]:
            return {name.rsplit("/", 1)[-1] for name in files(s3_endpoint, prefix)}

        # 1.5 MiB over a budget of 1: the idle conversation goes once its lease is given back; the
        # two with a live session, each on its own replica, stay (nothing else can be evicted).
        with anyio.fail_after(60):
            while "idle.bin" in await anyio.to_thread.run_sync(stored):  # noqa: ASYNC110 - retention has no event
                await anyio.sleep(0.2)
            await anyio.sleep(2)  # the sweep that evicted it ends, and more sweeps of each replica run
        assert await anyio.to_thread.run_sync(stored) == {"a.bin", "b.bin"}
        kept = [await run(second, on_first, "print(x)"), await run(first, on_second, "print(y)")]
        assert [(r["stdout"], r["session"]) for r in kept] == [("1\n", "kept"), ("2\n", "kept")], kept
