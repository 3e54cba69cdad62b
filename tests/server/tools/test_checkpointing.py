"""``checkpoint`` and ``reset`` naming a checkpoint, in memory on the backend test double.

Saving, restoring and deleting a conversation's checkpoint through ``run_python`` and what the
result says of it are the server's; tests/e2e/conversations/test_checkpoints.py checks on real
sandboxes the files a checkpoint keeps (the copy keeps only files of the workspace's owner uid,
and the double runs code as this process's uid), the quota and a tampered state.
"""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from mcp import Client

from doubles.sandbox import PlainProcessBackend
from mcp_test_helpers import memory_client, new_conversation, run_in, run_python, structured, text

pytestmark = pytest.mark.anyio


@pytest.fixture(scope="module")
async def client(module_state_dir: Path) -> AsyncIterator[Client]:
    backend = PlainProcessBackend()
    runtime = Path(sys.prefix)
    async with memory_client(module_state_dir, runtime, backend=backend, prestart_size=0, max_checkpoints=3) as client:
        yield client


async def test_a_checkpoint_saved_before_the_code_is_restored_with_its_variables(client: Client) -> None:
    conversation = new_conversation()
    await run_in(client, "count = 1", conversation)
    saved = await run_in(client, "count = 2", conversation, checkpoint="one")
    answer = await run_python(client, {"code": "print(count)", "conversationId": conversation, "reset": "one"})
    restored = structured(answer)
    goes_on = await run_in(client, "count += 10\nprint(count)", conversation)

    assert saved["status"] == "success", saved
    assert saved["checkpoint"]["saved"]["name"] == "one" and saved["checkpoint"]["saved"]["variables"] is True
    assert (restored["status"], restored["stdout"], restored["session"]) == ("success", "1\n", "resumed"), restored
    assert restored["checkpoint"]["restored"]["name"] == "one"
    assert "(checkpoint 'one' restored before the run:" in text(answer)
    assert goes_on["stdout"] == "11\n"


async def test_a_checkpoint_is_deleted_by_name_and_a_missing_or_malformed_one_is_refused(client: Client) -> None:
    conversation = new_conversation()
    await run_in(client, "value = 'kept'", conversation)
    await run_in(client, "pass", conversation, checkpoint="a")
    await run_in(client, "pass", conversation, checkpoint="b")

    deleted = await run_in(client, "print(value)", conversation, checkpoint="-a")
    missing = await run_in(client, "print('ran')", conversation, checkpoint="-a")
    malformed = await run_in(client, "print('ran')", conversation, checkpoint="-../b")
    gone = await run_in(client, "print('ran')", conversation, reset="a")

    assert (deleted["status"], deleted["stdout"]) == ("success", "kept\n"), deleted
    assert deleted["checkpoint"]["deleted"]["name"] == "a" and deleted["checkpoint"]["deleted"]["checkpoints"] == ["b"]
    for refused in (missing, malformed, gone):
        assert refused["status"] == "validation_error" and refused["stdout"] == "", refused
    assert missing["error"] == "checkpoint: no checkpoint 'a' to delete in this conversation (it has: b)"
    assert malformed["error"].startswith("checkpoint:")
    assert gone["error"].startswith("reset:")


async def test_a_checkpoint_past_the_most_a_conversation_keeps_is_refused_before_the_code_runs(client: Client) -> None:
    conversation = new_conversation()
    names = [(await run_in(client, "pass", conversation, checkpoint=name))["status"] for name in ("a", "b", "c")]
    fourth = await run_in(client, "print('ran')", conversation, checkpoint="d")
    resaved = await run_in(client, "pass", conversation, checkpoint="b")

    assert names == ["success"] * 3
    assert fourth["status"] == "validation_error" and fourth["stdout"] == ""
    assert "keeps 3 checkpoints, the most it may (max_checkpoints 3): save over one of a, b, c" in fourth["error"]
    assert resaved["status"] == "success", resaved


async def test_a_checkpoint_without_a_conversation_is_refused_naming_it(client: Client) -> None:
    result = structured(await run_python(client, {"code": "pass", "checkpoint": "one"}))

    assert result["status"] == "validation_error"
    assert result["error"].startswith("checkpoint:") and "conversationId" in result["error"]
