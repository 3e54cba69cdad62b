"""``forkFrom`` across tenants, over a real ``serve --transport http`` with two bearer tokens.

A conversation id names a conversation of the caller's tenant only: another tenant's
conversation of the same id is simply not found, and a fork of one's own never sees the other's.
"""

from __future__ import annotations

import textwrap
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from mcp_test_helpers import auth_tokens, http_server, new_conversation, run_over_http

pytestmark = [pytest.mark.e2e, pytest.mark.anyio]

ALICE = "alice-fork-token-0123456789abcdef"
BOB = "bob-fork-token-0123456789abcdef000"


@pytest.fixture(scope="module")
async def base(module_state_dir: Path, sandbox_runtime: Path | None) -> AsyncIterator[str]:
    config = module_state_dir.parent / f"fork-tenants-{uuid.uuid4().hex[:8]}.toml"
    config.write_text(textwrap.dedent("pool_preload = []\n") + auth_tokens({"alice": ALICE}, {"bob": BOB}))
    async with http_server(module_state_dir, "--config", str(config), runtime=sandbox_runtime) as url:
        yield url


async def test_another_tenants_conversation_cannot_be_forked_and_is_not_found(base: str) -> None:
    alices = new_conversation()
    made = await run_over_http(
        base, ALICE, "secret = 'alice'\nopen('secret.txt', 'w').write('alice')", conversationId=alices
    )
    assert made["status"] == "success", made

    refused = await run_over_http(base, BOB, "print(secret)", conversationId=new_conversation(), forkFrom=alices)
    # Bob's own conversation of the same id is his: a fork of it has his files, none of Alice's.
    bobs = await run_over_http(base, BOB, "open('mine.txt', 'w').write('bob')", conversationId=alices)
    forked = await run_over_http(
        base,
        BOB,
        "import os\nprint(sorted(os.listdir('.')), 'secret' in globals())",
        conversationId=new_conversation(),
        forkFrom=alices,
    )

    assert refused["status"] == "validation_error"
    assert refused["error"] == f"forkFrom: no conversation {alices!r}"
    assert bobs["status"] == "success", bobs
    assert forked["status"] == "success", forked
    assert forked["stdout"] == "['mine.txt'] False\n"
