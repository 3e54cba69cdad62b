"""Leases on both engines of the metadata index, and a router over them: one owner per conversation.

Two replicas are two :class:`LeaseTable` views of one database under different ``replica_url``s;
the router's forwarding goes to a real closed port (a replica that died). The whole servers are
tests/replicas/test_forwarding.py's, test_handover.py's and test_internal_route.py's.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import anyio
import mcp_types as types
import pytest

from mcp_sandbox.errors import LeaseLostError, QuotaExceededError
from mcp_sandbox.replicas.forward import Forwarder, Here, Moved, Owner, Router
from mcp_sandbox.replicas.leases import LAPSED_ELSEWHERE, LAPSED_HERE, STOPPED, Leases, LeaseTable
from mcp_sandbox.replicas.signing import Verifier, sign
from mcp_sandbox.server.busy import Busy
from mcp_sandbox.workspace import FileEntry, Metadata
from mcp_sandbox.workspace.fencing import Fence
from mcp_test_helpers import free_port
from postgres_helpers import Cluster, MetadataTarget, postgres_cluster

pytestmark = pytest.mark.anyio

KEY = "c" * 64
A, B = "http://a.replica:1", "http://b.replica:1"


@pytest.fixture
def metadata(metadata_target: MetadataTarget) -> Iterator[Metadata]:
    opened = Metadata.open(metadata_target.path, metadata_target.url)
    try:
        yield opened
    finally:
        opened.close()


def test_a_lease_is_held_by_one_replica_until_it_expires_or_is_given_back(metadata: Metadata) -> None:
    a, b = LeaseTable(metadata.database, A), LeaseTable(metadata.database, B)

    first = a.claim(KEY, 100.0, 10.0)
    refused = b.claim(KEY, 105.0, 10.0)
    renewed = a.claim(KEY, 105.0, 10.0)
    taken = b.claim(KEY, 116.0, 10.0)  # a's lease ran out at 115: a died
    b.release({KEY: (taken.epoch, taken.expires)})
    given = a.claim(KEY, 117.0, 10.0)

    assert (first.mine, first.fresh, first.epoch) == (True, True, 1)
    assert (refused.mine, refused.owner, refused.expires) == (False, A, 110.0)
    assert (renewed.mine, renewed.fresh, renewed.epoch, renewed.expires) == (True, False, 1, 115.0)
    assert (taken.mine, taken.fresh, taken.taken_over, taken.epoch) == (True, True, True, 2)
    assert (given.mine, given.fresh, given.taken_over, given.epoch) == (True, True, False, 3)


def test_writes_fenced_by_a_lost_or_lapsed_lease_record_nothing_and_the_owners_do(metadata: Metadata) -> None:
    a, b = LeaseTable(metadata.database, A), LeaseTable(metadata.database, B)
    lapsed_key = "d" * 64
    for key in (KEY, lapsed_key):
        metadata.touch_conversation(key, "alice", 1.0)
    now = time.time()
    stalled = Fence(A, a.claim(KEY, now - 20.0, 10.0).epoch)  # a's lease ran out 10 s ago
    owner = Fence(B, b.claim(KEY, now, 10.0).epoch)  # and b took it
    lapsed = Fence(A, a.claim(lapsed_key, now - 20.0, 10.0).epoch)  # ran out, taken by no one yet
    late = FileEntry("late.bin", 10, 1.0)

    for fence, key in ((stalled, KEY), (lapsed, lapsed_key)):
        with pytest.raises(LeaseLostError):
            metadata.record_file_within_quota(key, late, 100, 10, fence)
        with pytest.raises(LeaseLostError):
            metadata.record_files(key, [late], fence=fence)
        with pytest.raises(LeaseLostError):
            metadata.fence_check(key, fence)()
    admit = metadata.admitting(KEY, owner, 100, 10)
    assert admit is not None and metadata.admitting(KEY, None, 100, 10) is None  # one server: no fence
    admit(FileEntry("kept.bin", 60, 1.0))
    with pytest.raises(QuotaExceededError) as over:
        admit(FileEntry("over.bin", 50, 1.0))
    metadata.fence_check(KEY, owner)()
    assert (over.value.limit, over.value.used, over.value.quota) == ("bytes", 60, 100)
    assert {(row.key, row.bytes, row.files) for row in metadata.conversations_by_last_use()} == {
        (KEY, 60, 1),
        (lapsed_key, 0, 0),
    }


def test_a_stale_epoch_renews_nothing_and_a_release_racing_a_renewal_keeps_the_lease(metadata: Metadata) -> None:
    a, b = LeaseTable(metadata.database, A), LeaseTable(metadata.database, B)
    old = a.claim(KEY, 100.0, 10.0)
    b.claim(KEY, 111.0, 10.0)
    again = a.claim(KEY, 122.0, 10.0)

    assert a.renew({KEY: old.epoch}, 123.0, 10.0) == set()  # the epoch moved on: fenced
    assert a.renew({KEY: again.epoch}, 123.0, 10.0) == {KEY}
    a.release({KEY: (again.epoch, again.expires)})  # expired at 132 as last known; renewed to 133 since
    assert b.claim(KEY, 124.0, 10.0).mine is False


async def test_a_lease_another_replica_took_has_its_session_ended_here(metadata: Metadata) -> None:
    fenced: list[str] = []

    async def fence(key: str) -> None:
        fenced.append(key)

    ttl = 3.0
    mine = Leases(LeaseTable(metadata.database, A), ttl, fence, Busy(lambda: {KEY}), set)
    assert (await mine.claim(KEY)).mine
    LeaseTable(metadata.database, B).claim(KEY, time.time() + ttl, ttl)  # as if A's clock had stalled past it

    await mine.tick()

    assert fenced == [KEY] and mine.held == set()


async def test_leases_no_session_uses_are_given_back_and_the_others_renewed(metadata: Metadata) -> None:
    async def fence(key: str) -> None:
        raise AssertionError("nothing is fenced")

    ttl = 3.0  # the tick bounds its database work by a third of it: room for a loaded machine
    used = "d" * 64
    mine = Leases(LeaseTable(metadata.database, A), ttl, fence, Busy(lambda: {used}), set)
    await mine.claim(KEY)
    await mine.claim(used)
    await anyio.sleep(ttl / 3)

    await mine.tick()

    assert mine.held == {used}
    other = LeaseTable(metadata.database, B)
    assert other.claim(KEY, time.time(), ttl).mine  # given back: free at once
    assert not other.claim(used, time.time(), ttl).mine


async def test_a_lease_whose_call_waits_for_its_restore_is_kept_until_the_call_ends(metadata: Metadata) -> None:
    # Given back while the call waited for its restore (nothing marked the conversation active
    # yet), the lease went to another replica and both stored files, each within its own view
    # of the quota (issue 37).
    async def fence(key: str) -> None:
        raise AssertionError("nothing is fenced")

    restoring, restored = anyio.Event(), anyio.Event()

    async def restore(key: str, epoch: int) -> None:
        restoring.set()
        await restored.wait()

    async def local() -> types.CallToolResult:
        return types.CallToolResult(content=[types.TextContent(type="text", text="ran")])

    ttl = 3.0
    leases = Leases(LeaseTable(metadata.database, A), ttl, fence, Busy(set), set)  # no session, no work marked
    forwarder = Forwarder(A, b"k" * 32, 5.0)
    router = Router(leases, forwarder, Verifier(b"k" * 32), restore)
    results: list[types.CallToolResult] = []

    async def call() -> None:
        with router.calling(KEY):
            where = await router.route(KEY, "upload_file", {}, "default")
            results.append(await local() if isinstance(where, Here) else where.result)

    try:
        with anyio.fail_after(ttl * 5):
            async with anyio.create_task_group() as group:
                group.start_soon(call)
                await restoring.wait()
                await anyio.sleep(ttl / 3)  # the claim is old enough for an idle lease to be given back
                await leases.tick()
                assert leases.held == {KEY}
                assert not LeaseTable(metadata.database, B).claim(KEY, time.time(), ttl).mine
                restored.set()
    finally:
        await forwarder.aclose()

    assert [result.is_error for result in results] == [False]
    await anyio.sleep(ttl / 3)
    await leases.tick()  # the call has ended: now it is idle, and given back
    assert leases.held == set()


@pytest.fixture
def own_cluster() -> Iterator[Cluster]:
    with postgres_cluster() as cluster:
        yield cluster


async def test_a_replica_that_cannot_reach_the_database_ends_its_sessions_before_its_leases_expire(
    own_cluster: Cluster, tmp_path: Path
) -> None:
    metadata = Metadata.open(tmp_path / "unused.sqlite3", own_cluster.create_database())
    ended: list[tuple[str, float]] = []

    async def fence(key: str) -> None:
        ended.append((key, time.time()))

    ttl = 3.0
    try:
        mine = Leases(LeaseTable(metadata.database, A), ttl, fence, Busy(lambda: {KEY}), set)
        claim = await mine.claim(KEY)
        own_cluster.stop()

        with anyio.fail_after(ttl * 3):
            while not ended:
                await mine.tick()
                await anyio.sleep(ttl / 3)

        assert ended[0][0] == KEY
        assert ended[0][1] < claim.expires  # before any other replica could take the lease
    finally:
        metadata.close()


async def test_a_call_whose_owner_is_gone_waits_for_its_lease_then_restores_and_marks_the_state_lost(
    metadata: Metadata,
) -> None:
    ttl = 1.0
    dead = f"http://127.0.0.1:{free_port()}"  # nothing listens: connection refused
    LeaseTable(metadata.database, dead).claim(KEY, time.time(), ttl)
    restored: list[str] = []

    async def restore(key: str, epoch: int) -> None:
        restored.append(key)

    async def nothing(key: str) -> None:
        return None

    async def local() -> types.CallToolResult:
        return types.CallToolResult(
            content=[types.TextContent(type="text", text="ran")], structured_content={"status": "success"}
        )

    leases = Leases(LeaseTable(metadata.database, A), ttl, nothing, Busy(lambda: {KEY}), set)
    forwarder = Forwarder(A, b"k" * 32, 5.0)
    router = Router(leases, forwarder, Verifier(b"k" * 32), restore)
    try:
        with anyio.fail_after(ttl + 10):
            with router.calling(KEY):
                where = await router.route(KEY, "run_python", {"code": "1"}, "default")
                result = await local() if isinstance(where, Here) else where.result
    finally:
        await forwarder.aclose()

    assert restored == [KEY]
    assert result.structured_content == {"status": "success"}  # said by the next run (tools/run.py), not any call
    assert next(block.text for block in result.content if isinstance(block, types.TextContent)) == "ran"
    assert leases.table.take_lost(KEY) == LAPSED_ELSEWHERE
    assert leases.table.take_lost(KEY) is None  # said once


async def test_the_router_decides_here_with_the_epoch_or_names_the_owner_and_the_owners_side_agrees(
    metadata: Metadata,
) -> None:
    restored: list[tuple[str, int]] = []

    async def restore(key: str, epoch: int) -> None:
        restored.append((key, epoch))

    async def nothing(key: str) -> None:
        return None

    ttl = 30.0
    other = "c" * 63 + "d"
    LeaseTable(metadata.database, B).claim(other, time.time(), ttl)
    leases = Leases(LeaseTable(metadata.database, A), ttl, nothing, Busy(set), set)
    forwarder = Forwarder(A, b"k" * 32, 5.0)
    router = Router(leases, forwarder, Verifier(b"k" * 32), restore)
    try:
        with router.calling(KEY):
            here = await router.place(KEY)
            accepted = await router.accept(KEY, draining=False)
            kept = await router.accept(KEY, draining=True)  # a held lease still serves its call
        elsewhere = await router.place(other)
        with pytest.raises(Moved) as moved:
            await router.accept(other, draining=False)
        with pytest.raises(Moved) as draining:
            await router.accept(other, draining=True)  # a draining replica takes no lease
    finally:
        await forwarder.aclose()

    assert here == accepted == kept == Here(1)
    assert restored == [(KEY, 1)]  # once per epoch, however many calls decide
    assert isinstance(elsewhere, Owner)
    assert elsewhere.url == B
    assert (str(moved.value), str(draining.value)) == (B, A)


def test_a_signature_is_accepted_once_within_its_window_and_only_with_the_key() -> None:
    key, body, now = b"k" * 32, b'{"to": "x"}', 1000.0
    verifier = Verifier(key)
    headers = sign(key, body, now)
    stamp, mac = headers["x-mcp-sandbox-time"], headers["x-mcp-sandbox-signature"]

    assert Verifier(b"j" * 32).refusal(stamp, mac, body, now) is not None
    assert verifier.refusal(stamp, mac, body + b" ", now) is not None
    assert verifier.refusal(stamp, mac, body, now + 31) is not None
    assert verifier.refusal(None, None, body, now) is not None
    assert verifier.refusal(stamp, mac, body, now + 1) is None
    assert verifier.refusal(stamp, mac, body, now + 2) is not None  # replayed


def test_a_replay_is_refused_after_thousands_of_other_calls_until_its_stamp_leaves_the_window() -> None:
    key, now = b"k" * 32, 1000.0
    verifier = Verifier(key, window=30.0)

    def check(body: bytes, sent: float, at: float) -> str | None:
        headers = sign(key, body, sent)
        return verifier.refusal(headers["x-mcp-sandbox-time"], headers["x-mcp-sandbox-signature"], body, at)

    first = b'{"n": -1}'
    accepted = check(first, now + 29, now)  # a sender whose clock is ahead, within the window
    others = [check(b'{"n": %d}' % n, now + n / 100, now + n / 100) for n in range(5000)]  # 50 busy seconds

    assert accepted is None and others == [None] * 5000
    assert check(first, now + 29, now + 58) is not None  # replayed: its stamp is still in the window
    assert check(first, now + 29, now + 60) is not None  # its stamp is out of the window now


def test_a_lapsed_lease_taken_again_or_one_given_back_with_its_session_marks_the_state_lost_once(
    metadata: Metadata,
) -> None:
    mine, other = LeaseTable(metadata.database, A), LeaseTable(metadata.database, "http://b.invalid")
    mine.claim(KEY, 100.0, 1.0)
    mine.claim(KEY, 200.0, 1.0)  # its own lease lapsed (the database or the replica stalled): taken again
    assert mine.take_lost(KEY) == LAPSED_HERE
    assert mine.take_lost(KEY) is None
    other.claim(KEY, 300.0, 1.0)  # taken over after it lapsed
    assert mine.take_lost(KEY) == LAPSED_ELSEWHERE
    other.release({KEY: (3, 1e18)}, lost={KEY})  # a rollout: given back with a live session
    assert mine.take_lost(KEY) == STOPPED
    mine.claim(KEY, 400.0, 1.0)  # a lease given back is not lapsed: nothing more to say
    mine.release({KEY: (4, 1e18)})
    mine.claim(KEY, 500.0, 1.0)
    assert mine.take_lost(KEY) is None


async def test_a_drain_keeps_the_lease_of_a_call_still_waiting_for_its_restore(metadata: Metadata) -> None:
    # The drain keeps the leases of the calls in flight; it once read only the calls past their
    # claim, and gave back the lease of one still waiting for its restore.
    async def fence(key: str) -> None:
        raise AssertionError("nothing is fenced")

    idle = "d" * 64
    busy = Busy(set)
    leases = Leases(LeaseTable(metadata.database, A), 30.0, fence, busy, set)
    await leases.claim(idle)
    with leases.calling(KEY):
        await leases.claim(KEY)

        await leases.release_all(keep=busy.in_flight())

        assert leases.held == {KEY}
        other = LeaseTable(metadata.database, B)
        assert not other.claim(KEY, time.time(), 30.0).mine
        assert other.claim(idle, time.time(), 30.0).mine


async def test_a_drain_marks_lost_only_the_conversations_with_a_live_interpreter(metadata: Metadata) -> None:
    # An upload in flight keeps its conversation's lease as a session does, but has no interpreter
    # to lose: its next run must not say its state was lost.
    async def fence(key: str) -> None:
        raise AssertionError("nothing is fenced")

    uploading, running = "d" * 64, "e" * 64
    leases = Leases(LeaseTable(metadata.database, A), 3.0, fence, Busy(lambda: {uploading, running}), lambda: {running})
    await leases.claim(uploading)
    await leases.claim(running)

    await leases.release_all()

    assert leases.table.take_lost(running) == STOPPED
    assert leases.table.take_lost(uploading) is None
