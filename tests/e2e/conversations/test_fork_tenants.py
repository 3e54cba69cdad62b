"""``forkFrom`` and parked sessions across tenants, over a real ``serve --transport http`` with two bearer tokens.

A conversation id names a conversation of the caller's tenant only: another tenant's
conversation of the same id is simply not found, a fork of one's own never sees the other's, and
another tenant's parked interpreter state is never resumed, forked nor read (issue 48).
"""

from __future__ import annotations

import textwrap
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import anyio
import pytest

from mcp_sandbox.config import load_settings
from mcp_sandbox.state import StateLayout
from mcp_sandbox.workspace import load_secret
from mcp_sandbox.workspace.checkpoints import state_key
from mcp_test_helpers import auth_tokens, http_server, new_conversation, poll, run_over_http
from settings_helpers import store_of

pytestmark = [pytest.mark.e2e, pytest.mark.anyio]

ALICE = "alice-fork-token-0123456789abcdef"
BOB = "bob-fork-token-0123456789abcdef000"


@pytest.fixture(scope="module")
async def base(module_state_dir: Path, sandbox_runtime: Path | None) -> AsyncIterator[str]:
    """The server's URL; its state directory is ``module_state_dir``."""
    config = module_state_dir.parent / f"fork-tenants-{uuid.uuid4().hex[:8]}.toml"
    # A session idle for a second is parked (the other test never waits that long between its calls).
    settings = textwrap.dedent("pool_preload = []\nsession_park_after = 1\n")
    config.write_text(settings + auth_tokens({"alice": ALICE}, {"bob": BOB}))
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


def _parked_state(state_dir: Path, tenant: str, conversation: str) -> Path:
    """Where the server parks ``tenant``'s ``conversation`` (its key, as the server's secret makes it)."""
    settings = load_settings(env={}, flags={"state_dir": str(state_dir)})
    key = store_of(settings, load_secret(state_dir)).key(tenant, conversation)
    return StateLayout.of(settings.paths, settings.sandbox, settings.workspaces).parked_state(key)


async def test_another_tenant_cannot_resume_fork_or_read_a_parked_state(base: str, module_state_dir: Path) -> None:
    alices = new_conversation()
    made = await run_over_http(base, ALICE, "alice_secret = 'alice-only'", conversationId=alices)
    assert made["status"] == "success", made
    parked = _parked_state(module_state_dir, "alice", alices)
    with anyio.fail_after(60):
        await poll(parked.exists)

    resumed = await run_over_http(base, BOB, "print(globals().get('alice_secret'))", conversationId=alices)
    forked = await run_over_http(
        base, BOB, "print(globals().get('alice_secret'))", conversationId=new_conversation(), forkFrom=alices
    )
    listed = await run_over_http(base, BOB, "import os\nprint(os.listdir('.'))", conversationId=alices)
    still_parked = parked.exists()
    alices_own = await run_over_http(base, ALICE, "print(alice_secret)", conversationId=alices)

    assert (resumed["status"], resumed["session"], resumed["stdout"]) == ("success", "new", "None\n")
    assert (forked["status"], forked["stdout"]) == ("success", "None\n"), forked  # his own, empty conversation
    assert forked["fork"]["variables"] == 0
    assert listed["stdout"] == "[]\n" and listed["files"] == []
    assert still_parked  # nothing Bob did touched it
    assert (alices_own["session"], alices_own["stdout"]) == ("resumed", "alice-only\n")


def _checkpoint_state(state_dir: Path, tenant: str, conversation: str, name: str) -> Path:
    """Where the server keeps the variables of ``tenant``'s ``conversation``'s checkpoint ``name``."""
    settings = load_settings(env={}, flags={"state_dir": str(state_dir)})
    key = store_of(settings, load_secret(state_dir)).key(tenant, conversation)
    return StateLayout.of(settings.paths, settings.sandbox, settings.workspaces).parked_state(state_key(key, name))


async def test_another_tenant_cannot_restore_fork_list_or_load_a_checkpoint(base: str, module_state_dir: Path) -> None:
    alices = new_conversation()
    made = await run_over_http(
        base, ALICE, "alice_secret = 'alice-only'\nopen('s.txt', 'w').write('alice')", conversationId=alices
    )
    saved = await run_over_http(base, ALICE, "alice_secret = 'changed'", conversationId=alices, checkpoint="cp")
    assert made["status"] == "success" and saved["status"] == "success", (made, saved)

    forked = await run_over_http(base, BOB, "print(1)", conversationId=new_conversation(), forkFrom=alices, reset="cp")
    restored = await run_over_http(base, BOB, "print(globals().get('alice_secret'))", conversationId=alices, reset="cp")
    # Bob's conversation of the same id is his own: its checkpoints list his names only.
    bobs = await run_over_http(base, BOB, "pass", conversationId=alices, checkpoint="cp")
    # Alice's checkpoint's variables put in place of his: signed for her checkpoint and tenant, refused.
    alices_state = _checkpoint_state(module_state_dir, "alice", alices, "cp")
    bobs_state = _checkpoint_state(module_state_dir, "bob", alices, "cp")
    bobs_state.write_bytes(alices_state.read_bytes())
    stolen = await run_over_http(base, BOB, "print(globals().get('alice_secret'))", conversationId=alices, reset="cp")
    alices_own = await run_over_http(
        base, ALICE, "print(alice_secret, open('s.txt').read())", conversationId=alices, reset="cp"
    )

    assert restored["status"] == "validation_error" and restored["stdout"] == ""
    assert restored["error"] == "reset: no checkpoint 'cp' in this conversation (it has: none)"
    assert forked["status"] == "validation_error"
    assert forked["error"] == f"forkFrom: no conversation {alices!r}"
    assert bobs["checkpoint"]["saved"]["checkpoints"] == ["cp"] and bobs["files"] == []
    assert stolen["status"] == "error" and stolen["stdout"] == ""
    assert stolen["error"].startswith("checkpoint 'cp': its saved interpreter state failed its integrity check")
    assert (alices_own["status"], alices_own["stdout"]) == ("success", "alice-only alice\n"), alices_own


async def test_another_tenant_cannot_delete_a_checkpoint(base: str, module_state_dir: Path) -> None:
    alices = new_conversation()
    made = await run_over_http(base, ALICE, "kept = 'alice'", conversationId=alices)
    saved = await run_over_http(base, ALICE, "pass", conversationId=alices, checkpoint="mine")
    assert made["status"] == "success" and saved["status"] == "success", (made, saved)
    state = _checkpoint_state(module_state_dir, "alice", alices, "mine")

    deleted = await run_over_http(base, BOB, "print('ran')", conversationId=alices, checkpoint="-mine")
    still = state.exists()
    alices_own = await run_over_http(base, ALICE, "print(kept)", conversationId=alices, reset="mine")

    assert deleted["status"] == "validation_error" and deleted["stdout"] == ""
    assert deleted["error"] == "checkpoint: no checkpoint 'mine' to delete in this conversation (it has: none)"
    assert still
    assert (alices_own["status"], alices_own["stdout"]) == ("success", "alice\n"), alices_own
