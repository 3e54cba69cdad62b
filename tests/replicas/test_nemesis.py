"""Replicas lose nothing acknowledged, whatever fails, one fault at a time (issue 44).

Three replicas behind HAProxy with PostgreSQL and SeaweedFS (tests/replicas/nemesis.py) take a
bounded workload of 4 clients (tests/replicas/model.py: runs writing files and variables, uploads
by tool and by ``POST /upload``, read-backs by hash, signed links) while the nemesis injects one
fault; each scenario then reads every conversation back through the balancer and through a
fresh server restoring from the store alone, and asserts that no acknowledged write was lost and
every conversation restores. Each scenario is one finding of the issue. ``MCP_SANDBOX_TEST_SOAK=N``
runs each N times with twice the conversations and more operations (CONTRIBUTING.md).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from functools import partial
from pathlib import Path

import anyio
import pytest
from mcp.types import CallToolResult

from balancer_helpers import Replica
from mcp_test_helpers import upload
from postgres_helpers import Cluster

from .model import UNSAVED, Model, mcp_client, sha
from .nemesis import LEASE, RECOVERY, Nemesis, faulty_cluster, require_root, soak_rounds, until

pytestmark = [pytest.mark.e2e, pytest.mark.sandbox, pytest.mark.anyio, pytest.mark.slow]

ROUNDS = soak_rounds()
OPS = 2 if ROUNDS == 1 else 4
# A call held longer than this by a frozen owner is held past its lease for nothing.
FROZEN_BOUND = LEASE * 6
AFTER = 1 if ROUNDS == 1 else OPS  # operations per conversation once the fault is over
LATE_CONTENT = b"late" * 1000
LATE = (
    "import time; open('/workspace/late-started', 'w').close(); time.sleep(1.5)\n"
    "open('/workspace/late.bin', 'wb').write(b'late' * 1000)"
)
# 946 bytes: three directories of 235 and a file name of 238, each under the 255 of a component.
LONG_NAME = "/".join(["d" * 235] * 3 + ["f" * 234 + ".bin"])


@pytest.fixture(scope="module")
async def nemesis(postgres: Cluster, sandbox_runtime: Path | None) -> AsyncIterator[Nemesis]:
    async with faulty_cluster(postgres, sandbox_runtime) as running:
        yield running


def assert_clean(model: Model, report: str) -> None:
    assert model.lost == [] and model.unrestorable == [], report
    assert model.corrupt == [] and model.refused == [] and model.statuses == [], report
    assert model.state == [] and model.held == [], report


async def scenario(nemesis: Nemesis, name: str) -> AsyncIterator[Model]:
    """A fresh model for each round, its conversations written once before the fault."""
    for round_ in range(ROUNDS):
        model = nemesis.model(f"{name}#{round_}")
        await nemesis.phase(model, ops=OPS)
        yield model


async def test_the_busiest_owner_killed_with_sigkill_mid_workload_loses_nothing_acknowledged(nemesis: Nemesis) -> None:
    async for model in scenario(nemesis, "owner kill -9"):
        async with anyio.create_task_group() as group:
            group.start_soon(partial(nemesis.phase, model, faulty=True, ops=OPS))
            victim = await nemesis.busiest_owner()
            await victim.kill()
        await victim.start()
        await nemesis.phase(model, ops=AFTER)
        assert_clean(model, await nemesis.verify(model))


async def test_an_owner_frozen_past_its_lease_holds_no_call_and_loses_nothing(nemesis: Nemesis) -> None:
    async for model in scenario(nemesis, "owner frozen"):
        busy = model.conversations[0]
        victim = await nemesis.owner(busy.id)
        other = next(r for r in nemesis.cluster.replicas if r is not victim)
        workspaces = victim.state_dir / "workspaces"
        async with anyio.create_task_group() as group:
            # A long run holds the conversation's lease on its owner when it freezes. Sent to the
            # owner itself: sent to another replica, it is that replica's forwarded call, which
            # takes it over once the lease lapses and runs its 20 s there, ahead of the phase's calls.
            long_run = "open('/workspace/long-started', 'w').close(); import time; time.sleep(20)"
            group.start_soon(partial(_call, nemesis, victim, busy.id, long_run))
            await until(partial(_written, workspaces, "long-started"), 30)
            with nemesis.frozen(victim):
                # Sent to a live replica (the balancer's checks would take the frozen one out in
                # their own time): the busy conversation's calls are forwarded to the frozen
                # owner until its lease runs out, then taken over; none waits longer than that.
                await nemesis.phase(model, faulty=True, bound=FROZEN_BOUND, ops=OPS, via=other)
            group.cancel_scope.cancel()
        await nemesis.phase(model, ops=AFTER)
        assert_clean(model, await nemesis.verify(model))


async def test_a_replica_with_a_full_disk_loses_nothing_and_serves_again_once_freed(nemesis: Nemesis) -> None:
    require_root(nemesis)
    async for model in scenario(nemesis, "full disk"):
        with nemesis.disk_full():
            await nemesis.phase(model, faulty=True, ops=OPS)
        await nemesis.phase(model, ops=AFTER)
        assert_clean(model, await nemesis.verify(model))


async def test_empty_files_restore_from_the_store(nemesis: Nemesis) -> None:
    async for model in scenario(nemesis, "empty file"):
        async with mcp_client(nemesis.cluster.url, nemesis.cluster.token) as client:
            for conversation in model.conversations:
                code = "open('/workspace/empty-run.txt', 'wb').close()"
                result = await client.call_tool("run_python", {"code": code, "conversationId": conversation.id})
                warning = str((result.structured_content or {}).get("warning"))
                conversation.sent["empty-run.txt"] = conversation.sent["empty-post.txt"] = sha(b"")
                if result.is_error or UNSAVED in warning:
                    model.refused.append(f"{conversation.id} empty-run.txt: {warning}")
                else:
                    conversation.acked["empty-run.txt"] = sha(b"")
                reply = await upload(nemesis.cluster.url, nemesis.cluster.token, conversation.id, "empty-post.txt", b"")
                if reply.status_code != 201:
                    model.refused.append(f"{conversation.id} empty-post.txt: {reply.status_code} {reply.text}")
                else:
                    conversation.acked["empty-post.txt"] = sha(b"")
        await nemesis.phase(model, ops=AFTER)
        assert_clean(model, await nemesis.verify(model))


async def test_a_946_byte_name_does_not_stop_the_conversations_other_files_being_saved(nemesis: Nemesis) -> None:
    async for model in scenario(nemesis, "long name"):
        data = b"L" * ((1 << 20) + 1)  # over the packs' limit: an object named by the file's path
        conversation = model.conversations[0]
        conversation.sent[LONG_NAME] = sha(data)
        reply = await upload(nemesis.cluster.url, nemesis.cluster.token, conversation.id, LONG_NAME, data)
        if reply.status_code == 201:
            conversation.acked[LONG_NAME] = sha(data)
        await nemesis.phase(model, ops=AFTER)
        assert_clean(model, await nemesis.verify(model))


def _written(workspaces: Path, name: str) -> bool:
    """Whether a run wrote ``name`` in a conversation's workspace under ``workspaces``."""
    return any(workspaces.glob(f"*/{name}"))


async def _call(nemesis: Nemesis, replica: Replica, conversation: str, code: str) -> None:
    """``code`` run in ``conversation`` on ``replica`` itself; its answer does not matter."""
    async with mcp_client(replica.url, nemesis.cluster.token) as client:
        await client.call_tool("run_python", {"code": code, "conversationId": conversation})


async def _held_write_back(nemesis: Nemesis, model: Model) -> CallToolResult | None:
    """Run LATE in the model's first conversation, pause the store once it has started (its files
    restored), freeze the owner once the run's write-back waits on the store, let the store go and
    the lease run out, write through the balancer (the new owners acknowledge), then continue the
    old owner; the late run's answer."""
    conversation = model.conversations[0]
    held: list[CallToolResult] = []

    async def late_run() -> None:
        # No answer (a frozen owner may hold the call: another finding's scenario) acknowledges nothing.
        with anyio.move_on_after(RECOVERY), contextlib.suppress(Exception):
            async with mcp_client(nemesis.cluster.url, nemesis.cluster.token) as client:
                held.append(await client.call_tool("run_python", {"code": LATE, "conversationId": conversation.id}))

    async with anyio.create_task_group() as group:
        group.start_soon(late_run)
        owner = await nemesis.owner(conversation.id)
        workspaces = owner.state_dir / "workspaces"
        await until(lambda: any(workspaces.glob("*/late-started")), 30)
        with nemesis.store_paused():
            # The run has written its file: its write-back waits on the paused store.
            await until(lambda: any(workspaces.glob("*/late.bin")), 30)
            await anyio.sleep(0.5)  # tiny: from the file's close to the write-back's first request
            with nemesis.frozen(owner):
                nemesis.weed.resume()
                await until(nemesis.leases_expired(owner), LEASE * 10)
                # Taken over: the new owners write and acknowledge. A call still held by the frozen
                # owner is the frozen scenario's finding, not this one's.
                await nemesis.phase(model, faulty=True, bound=FROZEN_BOUND, ops=1)
    return held[0] if held else None


async def test_an_owner_held_in_its_write_back_past_its_lease_does_not_replace_the_new_owners_index(
    nemesis: Nemesis,
) -> None:
    async for model in scenario(nemesis, "held index write"):
        answer = await _held_write_back(nemesis, model)
        model.held.clear()
        conversation = model.conversations[0]
        conversation.sent["late.bin"] = sha(LATE_CONTENT)
        warning = str((answer.structured_content or {}).get("warning")) if answer is not None else UNSAVED
        if answer is not None and not answer.is_error and UNSAVED not in warning:
            conversation.acked["late.bin"] = sha(LATE_CONTENT)  # acknowledged: it must be kept
        await nemesis.phase(model, ops=AFTER)
        assert_clean(model, await nemesis.verify(model))


async def test_a_paused_then_killed_store_answers_503_meanwhile_and_loses_nothing(nemesis: Nemesis) -> None:
    async for model in scenario(nemesis, "store paused, killed"):
        with nemesis.store_paused():
            await nemesis.phase(model, faulty=True, bound=LEASE * 4, ops=1)
        nemesis.weed.kill()
        try:
            await nemesis.phase(model, faulty=True, ops=1)
        finally:
            nemesis.weed.start()  # here, not in a worker thread: its parent-death signal follows the thread
        await nemesis.phase(model, ops=AFTER)
        model.held.clear()  # calls held by a paused store are its to answer, not a loss
        assert_clean(model, await nemesis.verify(model))


@pytest.mark.parametrize("crash", [False, True], ids=["fast", "crash"])
async def test_a_postgresql_restart_answers_503_meanwhile_and_loses_nothing(nemesis: Nemesis, crash: bool) -> None:
    async for model in scenario(nemesis, f"postgres {'crash' if crash else 'fast'} restart"):
        cluster = nemesis.postgres
        assert cluster.process is not None
        if crash:
            cluster.process.kill()
            cluster.process.wait(timeout=30)
            cluster.process = None
        else:
            cluster.stop()
        try:
            conversation = model.conversations[0]
            with anyio.fail_after(30):
                reply = await upload(nemesis.cluster.url, nemesis.cluster.token, conversation.id, "outage.bin", b"o")
            if reply.status_code != 503:  # reported with the rest below
                model.statuses.append(f"upload while PostgreSQL is down: {reply.status_code} {reply.text}")
        finally:
            cluster.start()  # here, not in a worker thread: its parent-death signal follows the thread
        await nemesis.phase(model, ops=AFTER)
        assert_clean(model, await nemesis.verify(model))
