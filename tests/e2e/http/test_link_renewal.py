"""Renewing expired download links: ``GET /files/renew`` re-signs a conversation's files for its owner.

A real ``serve --transport http`` with two tenants; links are made as the owner would get them
(``/upload``), then renewed, downloaded, and attacked from the other tenant and without a token.
"""

from __future__ import annotations

import math
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from mcp_sandbox.server.urls import UrlSigner
from mcp_sandbox.workspace import derive_key, load_secret
from mcp_test_helpers import auth_tokens, bearer_web, http_server, upload

pytestmark = [pytest.mark.e2e, pytest.mark.anyio]

ALICE = "alice-token-0123456789abcdef"
BOB = "bob-token-0123456789abcdef0000"
TTL = 3600


@pytest.fixture(scope="module")
async def base(module_state_dir: Path, sandbox_runtime: Path | None) -> AsyncIterator[str]:
    config = module_state_dir.parent / "renew.toml"
    config.write_text(f"url_ttl = {TTL}\n" + auth_tokens({"alice": ALICE}, {"bob": BOB}))
    async with http_server(module_state_dir, "--config", str(config), runtime=sandbox_runtime) as url:
        yield url


async def upload_url(base: str, conversation: str, name: str, data: bytes) -> str:
    """Upload as Alice; the stored file's download link."""
    stored = await upload(base, ALICE, conversation, name, data)
    assert stored.status_code == 201, stored.text
    url: str = stored.json()["files"][0]["url"]
    return url


async def test_the_owner_renews_one_files_link_and_it_downloads(base: str) -> None:
    conversation = f"c-{uuid.uuid4().hex}"
    await upload_url(base, conversation, "report.csv", b"a,b\n1,2\n")
    before = time.time()
    async with bearer_web(ALICE) as client:
        renewed = await client.get(f"{base}/files/renew", params={"conversationId": conversation, "name": "report.csv"})
    assert renewed.status_code == 200, renewed.text
    (entry,) = renewed.json()["files"]
    assert (entry["name"], entry["size"]) == ("report.csv", 8)
    assert math.ceil(before + TTL) <= entry["expires"] <= math.ceil(time.time() + TTL)
    async with bearer_web(None) as anonymous:  # the renewed link is a signed link: no token needed
        download = await anonymous.get(entry["url"])
    assert download.status_code == 200
    assert download.content == b"a,b\n1,2\n"


async def test_without_a_name_every_file_of_the_conversation_is_renewed(base: str) -> None:
    conversation = f"c-{uuid.uuid4().hex}"
    await upload_url(base, conversation, "a.txt", b"a")
    await upload_url(base, conversation, "sub/b.txt", b"bb")
    async with bearer_web(ALICE) as client:
        renewed = await client.get(f"{base}/files/renew", params={"conversationId": conversation})
    assert [(f["name"], f["size"]) for f in renewed.json()["files"]] == [("a.txt", 1), ("sub/b.txt", 2)]


async def test_an_expired_link_says_how_to_renew_it(base: str, module_state_dir: Path) -> None:
    conversation = f"c-{uuid.uuid4().hex}"
    url = await upload_url(base, conversation, "old.txt", b"old")
    key = url.split("/files/")[1].split("/")[0]
    expired = UrlSigner(derive_key(load_secret(module_state_dir), "download-url"), base, ttl=-60).file_url(
        key, "old.txt", now=time.time()
    )
    async with bearer_web(None) as anonymous:
        gone = await anonymous.get(expired)
    assert gone.status_code == 410
    assert "/files/renew" in gone.json()["error"]


async def test_another_tenant_cannot_renew_a_conversation_it_does_not_own(base: str) -> None:
    conversation = f"c-{uuid.uuid4().hex}"
    await upload_url(base, conversation, "secret.txt", b"alice only")
    async with bearer_web(BOB) as bob:
        one = await bob.get(f"{base}/files/renew", params={"conversationId": conversation, "name": "secret.txt"})
        every = await bob.get(f"{base}/files/renew", params={"conversationId": conversation})
    assert one.status_code == 404
    assert every.status_code == 200 and every.json() == {"files": []}  # bob's conversation of that id is empty


@pytest.mark.parametrize("token", [None, "not-a-valid-token-at-all-000"])
async def test_renewal_needs_a_valid_token(base: str, token: str | None) -> None:
    async with bearer_web(token) as client:
        refused = await client.get(f"{base}/files/renew", params={"conversationId": "x"})
    assert refused.status_code == 401


@pytest.mark.parametrize(
    "params",
    [{}, {"conversationId": ""}, {"conversationId": "x", "name": "../etc/passwd"}, {"conversationId": "x", "name": ""}],
)
async def test_bad_parameters_are_refused_naming_them(base: str, params: dict[str, str]) -> None:
    async with bearer_web(ALICE) as client:
        refused = await client.get(f"{base}/files/renew", params=params)
    assert refused.status_code == 400
    assert ("name" if "name" in params else "conversationId") in refused.json()["error"]
