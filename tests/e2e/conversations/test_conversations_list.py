"""The conversations list: ``POST /conversations`` answers a tenant about its own conversations only.

A real ``serve --transport http`` with two tenants; conversations are made as a client makes them
(``/upload``, a run), then listed by their owner, asked about by the other tenant, without a
token, and with bad bodies.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from mcp_sandbox.server.routes.conversations import MAX_IDS
from mcp_test_helpers import auth_tokens, bearer_web, http_server, new_conversation, run_over_http, upload

pytestmark = [pytest.mark.e2e, pytest.mark.anyio]

ALICE = "alice-token-0123456789abcdef"
BOB = "bob-token-0123456789abcdef0000"


@pytest.fixture(scope="module")
async def base(module_state_dir: Path, sandbox_runtime: Path | None) -> AsyncIterator[str]:
    config = module_state_dir.parent / "conversations.toml"
    config.write_text(auth_tokens({"alice": ALICE, "bob": BOB}))
    async with http_server(module_state_dir, "--config", str(config), runtime=sandbox_runtime) as url:
        yield url


async def listed(base: str, token: str | None, body: object) -> tuple[int, dict[str, Any]]:
    async with bearer_web(token) as client:
        answer = await client.post(f"{base}/conversations", json=body)
    assert answer.headers["cache-control"] == "no-store"
    return answer.status_code, answer.json() if answer.content else {}


async def test_the_owner_sees_its_conversations_most_recent_first_with_files_and_bytes(base: str) -> None:
    older, newer, unknown = new_conversation(), new_conversation(), new_conversation()
    before = time.time()
    assert (await upload(base, ALICE, older, "a.csv", b"a,b\n1,2\n")).status_code == 201
    assert (await upload(base, ALICE, older, "b.txt", b"bb")).status_code == 201
    await run_over_http(base, ALICE, "open('/workspace/out.txt', 'w').write('x' * 5)", conversationId=newer)

    status, answer = await listed(base, ALICE, {"conversationIds": [older, unknown, newer, older]})

    assert status == 200
    rows = answer["conversations"]
    assert [(row["conversationId"], row["files"], row["bytes"]) for row in rows] == [(newer, 1, 5), (older, 2, 10)]
    assert all(before - 1 <= row["created"] <= row["lastUsed"] <= time.time() + 1 for row in rows)
    assert isinstance(answer["others"], int) and answer["others"] >= 0


async def test_others_counts_the_tenants_conversations_it_did_not_name(base: str) -> None:
    named, unnamed = new_conversation(), new_conversation()
    for conversation in (named, unnamed):
        assert (await upload(base, BOB, conversation, "f.txt", b"f")).status_code == 201

    _, everything = await listed(base, BOB, {"conversationIds": [named, unnamed]})
    _, one = await listed(base, BOB, {"conversationIds": [named]})

    assert [row["conversationId"] for row in one["conversations"]] == [named]
    assert one["others"] == everything["others"] + 1


async def test_another_tenant_never_sees_a_conversation_of_the_same_id(base: str) -> None:
    conversation = new_conversation()
    assert (await upload(base, ALICE, conversation, "secret.txt", b"alice's")).status_code == 201

    status, answer = await listed(base, BOB, {"conversationIds": [conversation]})

    assert status == 200
    assert answer["conversations"] == []
    # Bob's own conversation of that id is his, with his files only.
    assert (await upload(base, BOB, conversation, "mine.txt", b"b")).status_code == 201
    _, again = await listed(base, BOB, {"conversationIds": [conversation]})
    assert [(row["files"], row["bytes"]) for row in again["conversations"]] == [(1, 1)]


async def test_without_a_valid_token_the_list_is_refused(base: str) -> None:
    for token in (None, "not-a-token-0123456789abcdef"):
        async with bearer_web(token) as client:
            answer = await client.post(f"{base}/conversations", json={"conversationIds": []})
        assert answer.status_code == 401


@pytest.mark.parametrize(
    ("body", "named"),
    [
        (b"not json", "body"),
        (b"[]", "body"),
        (b'{"conversationIds": [], "more": 1}', "body"),
        (b'{"conversationIds": "c"}', "conversationIds"),
        (b'{"conversationIds": ["ok", 7]}', "conversationIds[1]"),
        (b'{"conversationIds": ["ok", ""]}', "conversationIds[1]"),
        (b'{"conversationIds": ["a\\u0000b"]}', "conversationIds[0]"),
        (b'{"conversationIds": [' + b",".join([b'"c"'] * (MAX_IDS + 1)) + b"]}", "conversationIds"),
        (b'{"conversationIds": ["' + b"x" * (70 << 10) + b'"]}', "body"),
    ],
    ids=[
        "not-json",
        "not-an-object",
        "extra-field",
        "not-a-list",
        "not-a-string",
        "empty",
        "control",
        "too-many",
        "huge",
    ],
)
async def test_a_bad_body_is_refused_naming_what_was_wrong(base: str, body: bytes, named: str) -> None:
    async with bearer_web(ALICE) as client:
        answer = await client.post(f"{base}/conversations", content=body, headers={"Content-Type": "application/json"})

    assert answer.status_code == 400
    assert answer.json()["error"].startswith(f"{named}: ")
