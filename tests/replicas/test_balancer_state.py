"""The replicas' promises, checked through the balancer only, as a client sees them.

Three replicas behind deploy/haproxy.cfg share PostgreSQL and SeaweedFS: files written through
any of them are seen by all and their signed links open anywhere; a conversation's variables
follow it across replicas; a ``kill -9`` of its owner costs the variables (``stateLost``) and
nothing acknowledged; a rolling restart loses no file and no link; concurrent uploads through
two replicas cannot pass a conversation's quota, nor leave the index counting less than the store
holds (first, on fresh replicas). One set serves the module; the tests that kill or restart
replicas run last and leave every replica running.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import httpx2
import psycopg
import pytest
from mcp import Client

from balancer_helpers import ReplicaSet, replica_set
from mcp_sandbox.workspace import derive_key
from mcp_test_helpers import CALL_BOUND, new_conversation, structured, upload
from postgres_helpers import Cluster
from replica_helpers import lease_rows, shared_secret
from s3_helpers import files

pytestmark = [pytest.mark.e2e, pytest.mark.sandbox, pytest.mark.anyio, pytest.mark.slow]

LEASE = 4.0
QUOTA = 64 * 1024


@pytest.fixture(scope="module")
async def replicated(postgres: Cluster, s3_endpoint: str, sandbox_runtime: Path | None) -> AsyncIterator[ReplicaSet]:
    """Three replicas with a short lease and a small quota, for the module's tests."""
    env = {"MCP_SANDBOX_REPLICA_LEASE": f"{LEASE:g}", "MCP_SANDBOX_QUOTA_BYTES": str(QUOTA)}
    async with replica_set(postgres.create_database(), s3_endpoint, runtime=sandbox_runtime, env=env) as running:
        yield running


async def run(client: Client, conversation: str, code: str, bound: float = CALL_BOUND) -> dict[str, Any]:
    with anyio.fail_after(bound):
        result = await client.call_tool("run_python", {"code": code, "conversationId": conversation})
    assert not result.is_error, result
    return structured(result)


async def upload_tool(client: Client, conversation: str, name: str, content: bytes) -> dict[str, Any]:
    arguments = {"conversationId": conversation, "filename": name, "content": base64.b64encode(content).decode()}
    with anyio.fail_after(CALL_BOUND):
        result = await client.call_tool("upload_file", arguments)
    assert not result.is_error, result
    return structured(result)


async def counter(replicas: ReplicaSet, name: str) -> dict[str, float]:
    """``name`` summed over its labels, from each running replica's own ``/metrics``."""
    counts: dict[str, float] = {}
    headers = {"Authorization": f"Bearer {replicas.metrics_token}"}
    async with httpx2.AsyncClient(headers=headers, timeout=10, trust_env=False) as web:
        for replica in replicas.replicas:
            if replica.process is None:
                continue
            page = (await web.get(f"{replica.url}/metrics")).raise_for_status().text
            counts[replica.name] = sum(
                float(line.rsplit(" ", 1)[1])
                for line in page.splitlines()
                if line.startswith((f"{name} ", f"{name}{{"))
            )
    return counts


def served(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    return {name: after[name] - before.get(name, 0) for name in after}


async def download(url: str) -> tuple[int, bytes]:
    async with httpx2.AsyncClient(timeout=30, trust_env=False) as web:
        reply = await web.get(url)
    return reply.status_code, reply.content


def links(result: dict[str, Any]) -> dict[str, str]:
    return {entry["name"]: entry["url"] for entry in result.get("files", []) if entry.get("url")}


def conversation_key(replicas: ReplicaSet, conversation: str) -> str:
    """The key of the default tenant's ``conversation``: its lease, index row and store prefix."""
    key = derive_key(shared_secret(replicas.database_url), "workspace")
    framed = b"".join(len(part).to_bytes(8, "big") + part for part in (b"default", conversation.encode()))
    return hmac.new(key, framed, hashlib.sha256).hexdigest()


def owner(replicas: ReplicaSet, conversation: str) -> str:
    """The replica URL holding ``conversation``'s live lease."""
    key, now = conversation_key(replicas, conversation), time.time()
    found = {who for held, who, expires, _ in lease_rows(replicas.database_url) if held == key and expires > now}
    assert len(found) == 1, lease_rows(replicas.database_url)
    return found.pop()


def indexed_bytes(replicas: ReplicaSet, conversation: str) -> int:
    with psycopg.connect(replicas.database_url, autocommit=True) as db:
        rows = db.execute("SELECT key, bytes FROM conversations").fetchall()
    key = conversation_key(replicas, conversation)
    return sum(int(size) for held, size in rows if held == key)


def stored(s3_endpoint: str, replicas: ReplicaSet, conversation: str) -> dict[str, bytes]:
    """The conversation's files in the store (keys under the set's prefix naming it)."""
    key = conversation_key(replicas, conversation)
    return {name: body for name, body in files(s3_endpoint, replicas.store_url).items() if key in name}


async def test_concurrent_uploads_through_two_replicas_cannot_pass_the_quota(
    replicated: ReplicaSet, s3_endpoint: str
) -> None:
    conversation = new_conversation()
    size = QUOTA // 3 + 1  # two fit, three do not
    first, second = replicated.replicas[0], replicated.replicas[1]
    replies: list[httpx2.Response] = []

    async def send(base: str, index: int) -> None:
        replies.append(await upload(base, replicated.token, conversation, f"f{index}.bin", bytes([index]) * size))

    with anyio.fail_after(CALL_BOUND):
        async with anyio.create_task_group() as group:
            for index in range(8):
                group.start_soon(send, (first if index % 2 else second).url, index)

    accepted = [reply for reply in replies if reply.status_code == 201]
    refused = [reply for reply in replies if reply.status_code != 201]
    assert 1 <= len(accepted) <= 2, [(r.status_code, r.text) for r in replies]
    assert all(r.status_code == 413 and "quota" in r.text.lower() for r in refused), [
        (r.status_code, r.text) for r in refused
    ]
    in_store = stored(s3_endpoint, replicated, conversation)
    assert sum(len(body) for body in in_store.values()) == len(accepted) * size <= QUOTA, sorted(in_store)
    assert indexed_bytes(replicated, conversation) == len(accepted) * size


async def test_files_written_through_any_replica_are_seen_and_served_by_every_replica(
    replicated: ReplicaSet,
) -> None:
    conversations = [new_conversation() for _ in range(3)]
    downloads = await counter(replicated, "mcp_sandbox_downloads_total")
    async with replicated.client() as client:
        made: dict[str, str] = {}
        for index, conversation in enumerate(conversations):
            reply = await upload(replicated.url, replicated.token, conversation, "up.txt", f"http {index}".encode())
            assert reply.status_code == 201, reply.text
            await upload_tool(client, conversation, "tool.txt", f"tool {index}".encode())
            result = await run(
                client,
                conversation,
                f"open('/workspace/made.txt', 'w').write('made {index}')\n"
                "print(open('/workspace/up.txt').read(), open('/workspace/tool.txt').read())",
            )
            assert result["stdout"] == f"http {index} tool {index}\n", result
            made[conversation] = links(result)["made.txt"]
        for conversation, link in made.items():
            index = conversations.index(conversation)
            for _ in range(3):  # round-robin: each link fetched from more than one replica
                assert await download(link) == (200, f"made {index}".encode())
            seen = await run(client, conversation, "print(sorted(__import__('os').listdir('/workspace')))")
            assert seen["stdout"] == "['made.txt', 'tool.txt', 'up.txt']\n", seen
    spread = served(downloads, await counter(replicated, "mcp_sandbox_downloads_total"))
    for _ in range(50):  # a download is counted once its body is sent, just after the client has it
        if sum(spread.values()) >= 9:
            break
        await anyio.sleep(0.1)
        spread = served(downloads, await counter(replicated, "mcp_sandbox_downloads_total"))
    assert sum(spread.values()) == 9, spread
    assert sum(1 for count in spread.values() if count) >= 2, spread


async def test_a_conversations_variables_survive_calls_landing_on_different_replicas(
    replicated: ReplicaSet,
) -> None:
    conversation = new_conversation()
    before = await replicated.runs()
    async with replicated.client() as client:
        await run(client, conversation, "x = 0")
        for step in range(1, 7):
            result = await run(client, conversation, "x += 1\nprint(x)")
            assert (result["stdout"], result.get("session")) == (f"{step}\n", "kept"), result
            assert "stateLost" not in result
    ran = served(before, await replicated.runs())
    # Every call landed on some replica (round-robin); the owner ran them all.
    assert sum(ran.values()) == 7, ran
    assert owner(replicated, conversation) in {r.url for r in replicated.replicas}


async def test_a_killed_owner_costs_the_variables_and_no_acknowledged_file(
    replicated: ReplicaSet, s3_endpoint: str
) -> None:
    conversation = new_conversation()
    uploaded = bytes(range(256)) * 8
    async with replicated.client() as client:
        await run(client, conversation, "x = 1\nopen('/workspace/ran.bin', 'wb').write(bytes(range(200)) * 3)")
        reply = await upload(replicated.url, replicated.token, conversation, "up.bin", uploaded)
        assert reply.status_code == 201, reply.text
        await upload_tool(client, conversation, "tool.txt", b"by the tool")
        await run(client, conversation, "x += 1")

        (victim,) = [r for r in replicated.replicas if r.url == owner(replicated, conversation)]
        await victim.kill()
        try:
            started = time.monotonic()
            after = await run(
                client,
                conversation,
                "import hashlib\nprint('x' in globals(), "
                "*(hashlib.sha256(open(f'/workspace/{n}', 'rb').read()).hexdigest() "
                "for n in ('ran.bin', 'up.bin', 'tool.txt')))",
                bound=LEASE + CALL_BOUND,
            )
            waited = time.monotonic() - started
        finally:
            await victim.start()

    digests = [hashlib.sha256(body).hexdigest() for body in (bytes(range(200)) * 3, uploaded, b"by the tool")]
    assert after["stdout"] == " ".join(["False", *digests]) + "\n", after
    assert after["stateLost"] is True, after
    assert waited < LEASE + CALL_BOUND, waited
    assert owner(replicated, conversation) != victim.url


async def test_a_rolling_restart_loses_no_file_and_no_signed_link(replicated: ReplicaSet) -> None:
    conversation = new_conversation()
    async with replicated.client() as client:
        reply = await upload(replicated.url, replicated.token, conversation, "up.txt", b"uploaded before")
        assert reply.status_code == 201, reply.text
        made = await run(client, conversation, "open('/workspace/made.txt', 'w').write('written before')")
    before = {**links(made), "up.txt": reply.json()["files"][0]["url"]}
    expected = {"made.txt": b"written before", "up.txt": b"uploaded before"}
    assert set(before) >= set(expected), before

    for replica in replicated.replicas:  # one at a time: SIGTERM, wait, start, wait ready
        await replica.stop()
        await replica.start()

    for name, body in expected.items():
        got = await download(before[name])
        for _ in range(100):  # a 503 while the balancer's checks bring the last one back in
            if got[0] != 503:
                break
            await anyio.sleep(0.2)
            got = await download(before[name])
        assert got == (200, body), (name, got)
    async with replicated.client() as client:
        after = await run(
            client, conversation, "print(open('/workspace/made.txt').read(), open('/workspace/up.txt').read())"
        )
    assert after["stdout"] == "written before uploaded before\n", after
