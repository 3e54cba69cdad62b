"""Named checkpoints (issue 48, item 4) through the tools on real bwrap: ``checkpoint`` saves a
conversation's files and variables before the call's code, ``reset: <name>`` goes back to them,
``forkFrom`` with ``reset: <name>`` starts a new conversation there; the quota counts them, their
number is bounded, a tampered one is refused, and they go with their conversation.

One service in this process (``memory_client``) for the module, with a small quota; each test
its own conversations. The other tenant's attack is in test_fork_tenants.py (two bearer tokens).
"""

from __future__ import annotations

import base64
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client

from mcp_sandbox.config import load_settings
from mcp_sandbox.state import StateLayout
from mcp_sandbox.workspace import METADATA_FILE, Metadata, load_secret, sweep
from mcp_sandbox.workspace.checkpoints import state_key
from mcp_test_helpers import CALL_BOUND, memory_client, new_conversation, run_python, structured, text
from settings_helpers import store_of

pytestmark = [pytest.mark.e2e, pytest.mark.anyio]

_QUOTA = 4 << 20


@pytest.fixture(scope="module")
async def client(module_state_dir: Path, sandbox_runtime: Path | None) -> AsyncIterator[Client]:
    async with memory_client(module_state_dir, sandbox_runtime, quota_bytes=_QUOTA, max_checkpoints=3) as client:
        yield client


async def _run(client: Client, code: str, conversation: str, **arguments: Any) -> dict[str, Any]:
    return structured(await run_python(client, {"code": code, "conversationId": conversation, **arguments}))


def _key(state_dir: Path, conversation: str, tenant: str = "default") -> str:
    settings = load_settings(env={}, flags={"state_dir": str(state_dir)})
    return store_of(settings, load_secret(state_dir)).key(tenant, conversation)


async def test_a_checkpoint_saved_before_the_code_is_restored_with_its_files_and_variables(client: Client) -> None:
    conversation = new_conversation()
    first = await _run(client, "import json\ncount = 1\nopen('f.txt', 'w').write('one')", conversation)
    saved = await _run(
        client,
        "count = 2\nopen('f.txt', 'w').write('two')\nopen('g.txt', 'w').write('x')",
        conversation,
        checkpoint="one",
    )
    later = await _run(client, "count = 3\nprint(count, open('f.txt').read())", conversation)
    restoring = {"code": "import os\nprint(count, open('f.txt').read(), os.path.exists('g.txt'))", "reset": "one"}
    answer = await run_python(client, {**restoring, "conversationId": conversation})
    restored = structured(answer)
    goes_on = await _run(client, "count += 10\nprint(count, json.dumps([1]))", conversation)
    again = await _run(client, "print(count)", conversation, reset="one")

    assert first["status"] == "success", first
    assert saved["status"] == "success", saved
    assert saved["checkpoint"] == {
        "saved": {"name": "one", "files": 1, "bytes": 3, "variables": True, "checkpoints": ["one"]}
    }
    assert later["stdout"] == "3 two\n"
    assert restored["status"] == "success", restored
    assert restored["stdout"] == "1 one False\n"
    assert restored["session"] == "resumed"
    assert restored["checkpoint"] == {"restored": {"name": "one", "files": 1, "bytes": 3, "variables": True}}
    assert [item["name"] for item in restored["files"]] == ["f.txt"]
    assert "(checkpoint 'one' restored before the run: 1 files, its variables)" in text(answer)
    assert goes_on["stdout"] == "11 [1]\n"  # the restored interpreter is the live one now, imports and all
    assert again["stdout"] == "1\n"  # a checkpoint stays after a restore


async def test_a_fork_from_a_checkpoint_starts_a_new_conversation_there(client: Client) -> None:
    source, fork = new_conversation(), new_conversation()
    assert (await _run(client, "value = 'then'\nopen('a.txt', 'w').write('then')", source))["status"] == "success"
    assert (await _run(client, "value = 'now'\nopen('a.txt', 'w').write('now')", source, checkpoint="then"))[
        "status"
    ] == "success"

    forked = await _run(client, "print(value, open('a.txt').read())", fork, forkFrom=source, reset="then")
    unmoved = await _run(client, "print(value, open('a.txt').read())", source)
    missing = await _run(client, "pass", new_conversation(), forkFrom=source, reset="never")

    assert forked["status"] == "success", forked
    assert forked["stdout"] == "then then\n"
    assert forked["fork"]["checkpoint"] == "then" and forked["fork"]["files"] == 1
    assert unmoved["stdout"] == "now now\n"
    assert missing["status"] == "validation_error"
    assert missing["error"] == f"reset: no checkpoint 'never' in {source!r} (it has: then)"


async def test_the_quota_counts_checkpoints_and_their_number_is_bounded(client: Client) -> None:
    conversation = new_conversation()
    write = f"open('big.bin', 'wb').write(b'x' * {(_QUOTA * 3) // 8})"
    assert (await _run(client, write, conversation))["status"] == "success"
    first = await _run(client, "pass", conversation, checkpoint="big")
    second = await _run(client, "pass", conversation, checkpoint="bigger")
    with anyio.fail_after(CALL_BOUND):
        upload = await client.call_tool(
            "upload_file",
            {
                "conversationId": conversation,
                "filename": "more.bin",
                "content": base64.b64encode(b"y" * (_QUOTA // 3)).decode(),
            },
        )
    small = new_conversation()
    names = [(await _run(client, "pass", small, checkpoint=name))["status"] for name in ("a", "b", "c")]
    fourth = await _run(client, "print('ran')", small, checkpoint="d")
    resaved = await _run(client, "pass", small, checkpoint="b")

    assert first["status"] == "success", first
    assert second["status"] == "validation_error"
    assert second["error"].startswith("checkpoint: the conversation holds ")
    assert "would pass its quota" in second["error"]
    assert upload.is_error and "quota" in text(
        upload
    )  # 3/8 + 3/8 of the quota held: a third fits the files alone, not beside the checkpoint
    assert names == ["success"] * 3
    assert fourth["status"] == "validation_error" and fourth["stdout"] == ""
    assert "keeps 3 checkpoints, the most it may (max_checkpoints 3): save over one of a, b, c" in fourth["error"]
    assert resaved["status"] == "success", resaved


async def test_one_checkpoint_is_deleted_by_name_its_bytes_given_back_and_the_others_kept(
    client: Client, module_state_dir: Path
) -> None:
    conversation = new_conversation()
    code = "value = 'kept'\nopen('f.bin', 'wb').write(b'x' * 100_000)"
    assert (await _run(client, code, conversation))["status"] == "success"
    assert (await _run(client, "pass", conversation, checkpoint="a"))["status"] == "success"
    assert (await _run(client, "pass", conversation, checkpoint="b"))["status"] == "success"
    settings = load_settings(env={}, flags={"state_dir": str(module_state_dir)})
    store, key = store_of(settings, load_secret(module_state_dir)), _key(module_state_dir, conversation)
    layout = StateLayout.of(settings.paths, settings.sandbox, settings.workspaces)
    used = store.usage(key).bytes

    answer = await run_python(client, {"code": "print(value)", "conversationId": conversation, "checkpoint": "-a"})
    deleted = structured(answer)
    after = store.usage(key).bytes
    missing = await _run(client, "print('ran')", conversation, checkpoint="-a")
    malformed = await _run(client, "print('ran')", conversation, checkpoint="-../b")
    gone = await _run(client, "print('ran')", conversation, reset="a")

    assert (deleted["status"], deleted["stdout"], deleted["session"]) == ("success", "kept\n", "kept"), deleted
    freed = deleted["checkpoint"]["deleted"]
    assert freed["name"] == "a" and freed["checkpoints"] == ["b"] and freed["bytes"] > 100_000
    assert f"(checkpoint 'a' deleted before the run: {freed['bytes']} bytes freed; left: b)" in text(answer)
    assert used - after == freed["bytes"]  # given back to the conversation's quota
    assert not (layout.checkpoints / key / "a").exists()
    assert not layout.parked_state(state_key(key, "a")).exists()
    assert layout.parked_state(state_key(key, "b")).exists() and (layout.checkpoints / key / "b" / "f.bin").exists()
    for refused in (missing, malformed, gone):
        assert refused["status"] == "validation_error" and refused["stdout"] == "", refused
    assert missing["error"] == "checkpoint: no checkpoint 'a' to delete in this conversation (it has: b)"
    assert "a checkpoint's name is 1 to 64 letters" in malformed["error"]


async def test_a_checkpoint_whose_state_was_altered_is_refused_and_nothing_changes(
    client: Client, module_state_dir: Path
) -> None:
    conversation = new_conversation()
    assert (await _run(client, "value = 'saved'\nopen('f.txt', 'w').write('saved')", conversation))[
        "status"
    ] == "success"
    assert (await _run(client, "value = 'later'\nopen('f.txt', 'w').write('later')", conversation, checkpoint="cp"))[
        "status"
    ] == "success"
    settings = load_settings(env={}, flags={"state_dir": str(module_state_dir)})
    path = StateLayout.of(settings.paths, settings.sandbox, settings.workspaces).parked_state(
        state_key(_key(module_state_dir, conversation), "cp")
    )
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))

    refused = await _run(client, "open('ran.txt', 'w').write('ran')", conversation, reset="cp")
    after = await _run(client, "import os\nprint(value, open('f.txt').read(), os.path.exists('ran.txt'))", conversation)

    assert refused["status"] == "error"
    assert refused["error"].startswith("checkpoint 'cp': its saved interpreter state failed its integrity check")
    assert "nothing was restored and nothing ran" in refused["error"]
    assert after["stdout"] == "later later False\n"
    assert after["session"] == "kept"  # the live interpreter was left alone


async def test_a_conversations_checkpoints_are_deleted_with_it(state_dir: Path, sandbox_runtime: Path | None) -> None:
    conversation = new_conversation()
    async with memory_client(state_dir, sandbox_runtime) as client:
        saved = await _run(client, "kept = 1\nopen('f.txt', 'w').write('1')", conversation)
        saved = await _run(client, "pass", conversation, checkpoint="cp")
    assert saved["status"] == "success", saved
    settings = load_settings(env={}, flags={"state_dir": str(state_dir), "conversation_ttl": "1s"})
    store = store_of(settings, load_secret(state_dir))
    key = store.key("default", conversation)
    layout = StateLayout.of(settings.paths, settings.sandbox, settings.workspaces)
    state = layout.parked_state(state_key(key, "cp"))
    assert (layout.checkpoints / key / "cp" / "f.txt").exists() and state.exists()
    metadata = Metadata.open(state_dir / METADATA_FILE)
    try:
        report = sweep(store, metadata, settings.workspaces, time.time() + 10, busy=())
    finally:
        metadata.close()

    assert report.idle == [key]
    assert not (layout.checkpoints / key).exists()
    assert not state.exists()
