"""The replicas' internal route, for real: server processes on loopback sharing a PostgreSQL database.

The internal route runs nothing that is not signed with the replicas' shared secret, addressed to
the replica it reaches and seen there for the first time, even after that replica restarts; a
server with no ``replica_url`` takes no lease and has no internal route, and a ``replica_url`` it
cannot use is refused at start. The two attacks share one pair of replicas (each its own
conversation; the second restarts its target, and leaves it running).
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx2
import pytest

from mcp_sandbox.replicas.forward import CALL_PATH
from mcp_sandbox.replicas.running import FORWARD_KEY
from mcp_sandbox.replicas.signing import sign
from mcp_sandbox.workspace import derive_key
from mcp_test_helpers import http_client, http_server, mcp_sandbox_cli, new_conversation
from postgres_helpers import Cluster
from replica_helpers import TOKEN, Replica, conversation_key, lease_rows, replicas, run, shared_secret, structured_data

pytestmark = [pytest.mark.e2e, pytest.mark.anyio, pytest.mark.slow]


class Pair:
    """The module's two replicas and their database."""

    def __init__(self, database_url: str, replicas: list[Replica]) -> None:
        self.url = database_url
        self.replicas = replicas


@pytest.fixture(scope="module")
async def pair(postgres: Cluster, sandbox_runtime: Path | None) -> AsyncIterator[Pair]:
    """Two replicas with the default settings, for the attacks on the internal route."""
    url = postgres.create_database()
    async with replicas(2, url, sandbox_runtime) as started:
        yield Pair(url, started)


def _leases_of(url: str, conversation: str) -> list[tuple[str, str, float, int]]:
    key = conversation_key(url, conversation)
    return [row for row in lease_rows(url) if row[0] == key]


def _signed(key: bytes, body: dict[str, Any]) -> tuple[bytes, dict[str, str]]:
    content = json.dumps(body).encode()
    return content, {"content-type": "application/json", **sign(key, content, time.time())}


def _appending_call(target: Replica, other: Replica) -> tuple[str, dict[str, Any]]:
    """A new conversation, and the body of a call forwarded from ``other`` that appends to a file in it."""
    conversation = new_conversation()
    arguments = {"code": "print(open('/workspace/ran.txt', 'a').write('x'))", "conversationId": conversation}
    return conversation, {
        "to": target.url,
        "from": other.url,
        "tool": "run_python",
        "tenant": "default",
        "arguments": arguments,
    }


async def test_the_internal_route_refuses_unsigned_forged_replayed_and_misdirected_calls(pair: Pair) -> None:
    url, (target, other) = pair.url, pair.replicas
    async with httpx2.AsyncClient(timeout=60) as web:
        conversation, body = _appending_call(target, other)
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
        assert _leases_of(url, conversation) == []  # nothing ran: the conversation was not even claimed

        signed = await web.post(endpoint, content=content, headers=headers)
        replayed = await web.post(endpoint, content=content, headers=headers)

        assert signed.status_code == 200, signed.text
        assert signed.json()["structuredContent"]["stdout"] == "1\n"
        assert replayed.status_code == 401
        checked = await run(other, conversation, "print(open('/workspace/ran.txt').read())")
        assert checked["stdout"] == "x\n"  # the signed call ran once


async def test_a_captured_forwarded_call_replayed_after_its_owner_restarts_is_refused(pair: Pair) -> None:
    url, (target, other) = pair.url, pair.replicas
    async with httpx2.AsyncClient(timeout=60) as web:
        conversation, body = _appending_call(target, other)
        endpoint = target.url + CALL_PATH
        content = json.dumps(body).encode()
        # Stamped ahead (within the window): the restart below fits in the window with room to spare.
        key = derive_key(shared_secret(url), FORWARD_KEY)
        headers = {"content-type": "application/json", **sign(key, content, time.time() + 20)}

        signed = await web.post(endpoint, content=content, headers=headers)  # seen on the hop
        assert signed.status_code == 200, signed.text
        assert await target.stop() == 0
        await target.restart()  # a rollout: the owner's memory of seen calls is gone
        logged = len(target.output())  # the module's earlier replay is in its log too
        replayed = await web.post(endpoint, content=content, headers=headers)

        assert replayed.status_code == 401, replayed.text
        assert "a replayed request" in target.output()[logged:]
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

        assert not first.is_error and structured_data(second)["stdout"] == "2\n"
        assert "stateLost" not in structured_data(second)
        assert lease_rows(url) == []
        assert (await web.post(base + CALL_PATH, json={})).status_code == 404
