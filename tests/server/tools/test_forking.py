"""``forkFrom`` through ``run_python``, in memory on the backend test double: what a fork's call is answered.

The variables a fork carries, its refusals and what its result reports are the server's;
tests/e2e/conversations/test_fork.py checks on real sandboxes the files a fork copies (the copy
keeps only files of the workspace's owner uid, and the double runs code as this process's uid,
not the workspace's), what one side of a fork can see of the other (/tmp, background processes,
the scheduling attack) and, in test_fork_containers.py, on containers.
"""

from __future__ import annotations

import logging

import pytest
from mcp import Client

from mcp_test_helpers import new_conversation, run_in, run_ok, run_python, structured

pytestmark = pytest.mark.anyio


async def test_a_fork_carries_the_sources_variables_and_each_side_keeps_its_own(client: Client) -> None:
    source, fork = new_conversation(), new_conversation()
    await run_ok(client, "numbers = [1, 2]", source)

    forked = await run_ok(client, "numbers.append(3)\nprint(numbers)", fork, forkFrom=source)
    unmoved = await run_ok(client, "print(numbers)", source)
    kept = await run_ok(client, "print(numbers)", fork)

    assert forked["stdout"] == "[1, 2, 3]\n"
    assert (forked["fork"]["from"], forked["fork"]["variables"], forked["fork"]["skipped"]) == (source, 1, [])
    assert forked["session"] == "new"
    assert unmoved["stdout"] == "[1, 2]\n"
    assert kept["stdout"] == "[1, 2, 3]\n"


async def test_forks_that_cannot_be_made_are_refused_naming_what_was_wrong(
    client: Client, caplog: pytest.LogCaptureFixture
) -> None:
    source = new_conversation()
    await run_ok(client, "x = 1", source)
    existing = new_conversation()
    await run_ok(client, "y = 1", existing)

    no_conversation = structured(await run_python(client, {"code": "1", "forkFrom": source}))
    exists = await run_in(client, "1", existing, forkFrom=source)
    with caplog.at_level(logging.WARNING):
        missing = await run_in(client, "1", new_conversation(), forkFrom=new_conversation())
    itself = await run_in(client, "1", source, forkFrom=source)
    saved_at_once = await run_in(client, "1", new_conversation(), forkFrom=source, checkpoint="now")

    assert no_conversation["status"] == "validation_error"
    assert no_conversation["error"].startswith("forkFrom:") and "conversationId" in no_conversation["error"]
    assert exists["status"] == "validation_error"
    assert exists["error"].startswith("conversationId:")
    assert missing["status"] == "validation_error"
    assert missing["error"].startswith("forkFrom:")
    assert missing["files"] == []
    assert not caplog.records, [record.getMessage() for record in caplog.records]  # the new one was never made
    assert itself["status"] == "validation_error"
    assert itself["error"].startswith("forkFrom:")
    assert saved_at_once["status"] == "validation_error"
    assert saved_at_once["error"].startswith("checkpoint:")
